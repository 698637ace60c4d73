package replication

import (
	"context"
	"testing"
	"time"
)

// quietTiming is the shard groups' default fast timing with a short idle
// time and a quiet heartbeat timeout of 3 s (raft's own timer would then
// notice a dead leader after 3–6 s).
func quietTiming(rc *RaftConfig) {
	rc.HeartbeatTimeout, rc.ElectionTimeout, rc.LeaderLeaseTimeout = 200*time.Millisecond, 200*time.Millisecond, 150*time.Millisecond
	rc.QuietAfter = 300 * time.Millisecond
	rc.QuietHeartbeatTimeout = 3 * time.Second
}

// waitQuiet waits until every replica of gs not in skip is on the timing
// quiet asks for.
func waitQuiet(t *testing.T, gs []*Group, quiet bool, within time.Duration, skip int) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		all := true
		for i, g := range gs {
			if i != skip && g.Quiet() != quiet {
				all = false
			}
		}
		if all {
			return
		}
		if time.Now().After(deadline) {
			for i, g := range gs {
				t.Logf("replica %d: state %s, quiet %v", i, g.raft.State(), g.Quiet())
			}
			t.Fatalf("replicas not all quiet=%v within %s", quiet, within)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func heartbeatsSent(c *expediteCluster) int64 {
	var n int64
	for _, nd := range c.nodes {
		n += nd.mux.Stats().HeartbeatsSent.Load()
	}
	return n
}

// TestQuietGroupSleepsAndWakes: an idle group switches every replica to
// the quiet timing, after which its leader heartbeats a few times a second
// instead of fifty, and nobody campaigns; a write wakes every replica, and
// is applied on each; and a leader whose node dies while the group is
// quiet is replaced after the expedite silence, not raft's 3–6 s timer.
func TestQuietGroupSleepsAndWakes(t *testing.T) {
	c := newExpediteClusterWith(t, quietTiming, "q/0")
	gs := c.groups["q/0"]
	first, term := c.leader("q/0", 10*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	push := func(at int, seq uint64) {
		t.Helper()
		if _, err := gs[at].Push(ctx, &Push{Client: 1, Seq: seq, Keys: []uint64{7}, Grads: []float32{1, 2}}); err != nil {
			t.Fatalf("push %d at node %d: %v", seq, at, err)
		}
	}
	push(first, 1)
	waitQuiet(t, gs, true, 5*time.Second, -1)

	before := heartbeatsSent(c)
	const idle = 1500 * time.Millisecond
	time.Sleep(idle)
	sent := heartbeatsSent(c) - before
	// Fast, two followers get one every 20–40 ms: about 100 in 1.5 s.
	// Quiet, one every 0.3–0.6 s each: about 7.
	t.Logf("heartbeats sent in %s while quiet: %d", idle, sent)
	if sent > 25 {
		t.Fatalf("%d heartbeats in %s of a quiet group; a fast one sends about 100", sent, idle)
	}
	if l, tm := c.leader("q/0", time.Second); l != first || tm != term {
		t.Fatalf("the quiet group changed leader: node %d term %d, then node %d term %d", first, term, l, tm)
	}

	push(first, 2)
	waitQuiet(t, gs, false, time.Second, -1)
	for i, g := range gs {
		// SGD with learning rate 1: two pushes of (1, 2).
		out := make([]float32, 2)
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			if err := g.Pull(ctx, []uint64{7}, out, false); err == nil && out[0] == -2 && out[1] == -4 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("replica %d holds %v for key 7, want [-2 -4]", i, out)
			}
		}
	}

	waitQuiet(t, gs, true, 5*time.Second, -1)
	killed := time.Now()
	c.stopNodes(first)
	next, nterm := c.leader("q/0", 10*time.Second)
	took := time.Since(killed)
	t.Logf("quiet leader's node stopped; node %d leads term %d after %s", next, nterm, took.Round(time.Millisecond))
	if took > 2*time.Second {
		t.Fatalf("a quiet group took %s to replace its dead leader: raft's quiet timer, not the expedited election", took)
	}
	push(next, 3)
	waitQuiet(t, gs, false, time.Second, first)
}

// TestQuietWordOlderIgnored: a timing word that arrives after a newer one
// (a heartbeat batch overtaken by the next) does not undo it, and a new
// term's words count whatever their epoch.
func TestQuietWordOlderIgnored(t *testing.T) {
	c := newExpediteClusterWith(t, quietTiming, "w/0")
	l, term := c.leader("w/0", 10*time.Second)
	// Idle first: a follower whose log moved lately does not go quiet.
	waitQuiet(t, c.groups["w/0"], true, 5*time.Second, -1)
	g := c.groups["w/0"][(l+1)%3]
	f := g.replica.quiet
	leader := c.nodes[l].mux.cfg.LocalAddr
	// Far ahead of the leader's own epochs, so that its heartbeats do not
	// interfere during the test.
	if got := f.follow(term, leader, 1000<<wordEpochShift|wordQuiet); got != 1000<<wordEpochShift|wordQuiet || !g.Quiet() {
		t.Fatalf("quiet word of epoch 1000: answered %d, quiet %v", got, g.Quiet())
	}
	if got := f.follow(term, leader, 999<<wordEpochShift); got != 0 || !g.Quiet() {
		t.Fatalf("older fast word: answered %d, quiet %v; want it ignored", got, g.Quiet())
	}
	if got := f.follow(term, leader, 1001<<wordEpochShift); got != 1001<<wordEpochShift || g.Quiet() {
		t.Fatalf("newer fast word: answered %d, quiet %v", got, g.Quiet())
	}
	if got := f.follow(term+1, leader, 1<<wordEpochShift|wordQuiet); got != 1<<wordEpochShift|wordQuiet || !g.Quiet() {
		t.Fatalf("a new term's first quiet word: answered %d, quiet %v", got, g.Quiet())
	}
}

// TestQuietLeaderWakesWhenAFollowerStopsAnswering: a quiet leader whose
// heartbeat to a follower fails goes back to the fast timing (on the quiet
// one raft would retry that follower only after up to half the quiet
// timeout, and a restarted replica would campaign in vain meanwhile), and
// stays there while the follower is gone.
func TestQuietLeaderWakesWhenAFollowerStopsAnswering(t *testing.T) {
	c := newExpediteClusterWith(t, quietTiming, "f/0")
	gs := c.groups["f/0"]
	l, _ := c.leader("f/0", 10*time.Second)
	waitQuiet(t, gs, true, 5*time.Second, -1)
	c.stopNodes((l + 1) % 3)
	// The next quiet heartbeat to it (0.3–0.6 s) fails.
	deadline := time.Now().Add(3 * time.Second)
	for gs[l].Quiet() {
		if time.Now().After(deadline) {
			t.Fatal("the leader stayed quiet although a follower stopped answering")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Idle for longer than QuietAfter: it asks again, the follower that
	// is gone never answers, and the leader stays fast.
	time.Sleep(time.Second)
	if gs[l].Quiet() {
		t.Fatal("the leader went quiet again without an answer from every follower")
	}
}

// TestQuietFollowerWakesWhenItsLeaderFallsSilent: a quiet follower whose
// leader's node falls silent goes back to the fast timing even when it
// cannot start the expedited election (here the other follower's node is
// gone too, so it reaches no majority): raft's own timer then takes over
// within a fast heartbeat timeout, as before groups went quiet, rather
// than the quiet timer's seconds.
func TestQuietFollowerWakesWhenItsLeaderFallsSilent(t *testing.T) {
	c := newExpediteClusterWith(t, quietTiming, "s/0")
	gs := c.groups["s/0"]
	l, _ := c.leader("s/0", 10*time.Second)
	waitQuiet(t, gs, true, 5*time.Second, -1)
	last := (l + 2) % 3
	c.stopNodes(l, (l+1)%3)
	// Its quiet timer would fire 3–6 s after the last heartbeat, at least
	// 2.4 s from now.
	deadline := time.Now().Add(2 * time.Second)
	for gs[last].Quiet() {
		if time.Now().After(deadline) {
			t.Fatal("the follower stayed quiet although its leader's node fell silent")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
