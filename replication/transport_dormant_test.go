package replication

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// dormantTiming is quietTiming with dormancy half a second after quiet.
func dormantTiming(rc *RaftConfig) {
	quietTiming(rc)
	rc.DormantAfter = 500 * time.Millisecond
}

// waitDormant waits until every replica of gs not in skip is dormant and
// none leads.
func waitDormant(t *testing.T, gs []*Group, within time.Duration, skip int) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		all := true
		for i, g := range gs {
			if i != skip && (!g.Dormant() || g.raft.State() != raft.Follower) {
				all = false
			}
		}
		if all {
			return
		}
		if time.Now().After(deadline) {
			for i, g := range gs {
				t.Logf("replica %d: state %s, quiet %v, dormant %v", i, g.raft.State(), g.Quiet(), g.Dormant())
			}
			t.Fatalf("replicas not all dormant within %s", within)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func dormantTraffic(c *expediteCluster) (hb, appends, idle int64) {
	for _, nd := range c.nodes {
		s := nd.mux.Stats()
		hb += s.HeartbeatsSent.Load()
		appends += s.PipelinedAppends.Load()
		idle += s.IdleAppendsAnswered.Load()
	}
	return hb, appends, idle
}

func terms(gs []*Group) []uint64 {
	out := make([]uint64, len(gs))
	for i, g := range gs {
		out[i] = g.raft.CurrentTerm()
	}
	return out
}

// TestDormantGroupSleepsAndWakes: an idle group goes dormant: its leader
// steps down without an election, and then no replica sends anything or
// campaigns. A write at a follower names the former leader; at the former
// leader it wakes the group with one election and is applied everywhere;
// a linearizable read wakes it too. When the former leader's node dies
// while the group sleeps, a write at a survivor elects a new leader at once.
func TestDormantGroupSleepsAndWakes(t *testing.T) {
	c := newExpediteClusterWith(t, dormantTiming, "d/0")
	gs := c.groups["d/0"]
	first, _ := c.leader("d/0", 10*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	push := func(at int, seq uint64) error {
		_, err := gs[at].Push(ctx, &Push{Client: 1, Seq: seq, Keys: []uint64{7}, Grads: []float32{1, 2}})
		return err
	}
	if err := push(first, 1); err != nil {
		t.Fatal(err)
	}
	waitDormant(t, gs, 5*time.Second, -1)
	answered := int64(0)
	for _, nd := range c.nodes {
		answered += nd.mux.Stats().DormantAnswers.Load()
	}
	if answered == 0 {
		t.Fatal("the group is dormant, but no leader's append was answered to make it step down")
	}

	// Asleep: nothing sent, nobody campaigns.
	termsBefore := terms(gs)
	hb0, ap0, idle0 := dormantTraffic(c)
	time.Sleep(1500 * time.Millisecond)
	hb1, ap1, idle1 := dormantTraffic(c)
	if hb1 != hb0 || ap1 != ap0 || idle1 != idle0 {
		t.Fatalf("a dormant group's replicas talked for 1.5 s: %d heartbeats, %d appends, %d idle appends answered", hb1-hb0, ap1-ap0, idle1-idle0)
	}
	for i, tm := range terms(gs) {
		if tm != termsBefore[i] || !gs[i].Dormant() {
			t.Fatalf("replica %d: term %d → %d, dormant %v: a dormant group held an election", i, termsBefore[i], tm, gs[i].Dormant())
		}
	}

	// A follower names the former leader, whose node lives, and stays asleep.
	other := (first + 1) % 3
	err := push(other, 2)
	var nl *NotLeaderError
	if !errors.As(err, &nl) || nl.LeaderAddr != raft.ServerAddress(c.nodes[first].addr) {
		t.Fatalf("push at a dormant follower: %v; want NotLeader naming node %d", err, first)
	}
	if !gs[other].Dormant() {
		t.Fatal("a push refused by a dormant follower woke it")
	}

	// Concurrent writes at the former leader: one election wakes the group.
	wakes0 := c.nodes[first].mux.Stats().DormantWakes.Load()
	start := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for k := range errs {
		wg.Go(func() { errs[k] = push(first, uint64(10+k)) })
	}
	wg.Wait()
	t.Logf("4 concurrent pushes at the dormant former leader took %s", time.Since(start).Round(time.Millisecond))
	for k, err := range errs {
		if err != nil {
			t.Fatalf("push %d at the former leader: %v", k, err)
		}
	}
	if w := c.nodes[first].mux.Stats().DormantWakes.Load() - wakes0; w != 1 {
		t.Fatalf("%d elections to wake the group for 4 concurrent pushes; want 1", w)
	}
	waitQuiet(t, gs, false, 2*time.Second, -1)
	want := []float32{-5, -10} // SGD, learning rate 1: five pushes of (1, 2)
	for i, g := range gs {
		out := make([]float32, 2)
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			if err := g.Pull(ctx, []uint64{7}, out, false); err == nil && out[0] == want[0] && out[1] == want[1] {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("replica %d holds %v for key 7, want %v", i, out, want)
			}
		}
	}

	// A linearizable read wakes it too.
	waitDormant(t, gs, 5*time.Second, -1)
	out := make([]float32, 2)
	if err := gs[first].Pull(ctx, []uint64{7}, out, true); err != nil || out[0] != want[0] {
		t.Fatalf("linearizable pull at the dormant former leader: %v, %v", out, err)
	}

	// The former leader's node dies while the group sleeps.
	waitDormant(t, gs, 5*time.Second, -1)
	var former int
	for i, g := range gs {
		if a, _ := g.raft.LeaderWithID(); a == "" {
			former = i // the one that stepped down names nobody
		}
	}
	c.stopNodes(former)
	survivor := (former + 1) % 3
	// Until the node is found silent the survivor names it (and the
	// client would try it); then it wakes the group.
	start = time.Now()
	for seq := uint64(100); ; seq++ {
		err := push(survivor, seq)
		if err == nil {
			break
		}
		if !errors.As(err, &nl) || time.Since(start) > 5*time.Second {
			t.Fatalf("push at a survivor after the former leader's node died: %v", err)
		}
		// As a client does: where it is named, if that node lives.
		for i, nd := range c.nodes {
			if i != former && raft.ServerAddress(nd.addr) == nl.LeaderAddr {
				survivor = i
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("dormant group, former leader's node stopped: written at a survivor after %s", time.Since(start).Round(time.Millisecond))
	if took := time.Since(start); took > 3*time.Second {
		t.Fatalf("writes back after %s", took)
	}
}
