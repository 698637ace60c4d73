package replication

import (
	"context"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/raftps/raftps/replication/internal/reptest"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// expediteCluster is one shard group per name on the same three Mux nodes,
// with a slow Raft heartbeat timeout (1 s: raft's own timer would notice a
// dead leader after 1–3 s) and a loop calling ExpediteElection with a
// silence of 300 ms on every replica, as the shard node does.
type expediteCluster struct {
	t      *testing.T
	nodes  []*testNode
	groups map[string][]*Group

	mu      sync.Mutex
	stopped map[int]bool
	// deaf[i] is a sender ID node i refuses every message from (a link
	// cut one way), and whose node it does not run ExpediteElection on.
	deaf map[int]string
}

const expediteSilence = 300 * time.Millisecond

func newExpediteCluster(t *testing.T, names ...string) *expediteCluster {
	return newExpediteClusterWith(t, nil, names...)
}

// newExpediteClusterWith is newExpediteCluster with tune applied to every
// replica's config; its loop also ticks every replica (Group.Tick).
func newExpediteClusterWith(t *testing.T, tune func(*RaftConfig), names ...string) *expediteCluster {
	return newExpediteClusterMux(t, nil, tune, names...)
}

// newExpediteClusterMux is newExpediteClusterWith with tuneMux applied to
// node i's MuxConfig.
func newExpediteClusterMux(t *testing.T, tuneMux func(i int, cfg *MuxConfig), tune func(*RaftConfig), names ...string) *expediteCluster {
	c := &expediteCluster{t: t, groups: map[string][]*Group{}, stopped: map[int]bool{}, deaf: map[int]string{}}
	var peers []raft.Server
	for i := range 3 {
		// As a node's Authorize, which finds the caller in the gRPC
		// context: an election this node starts for its own replica
		// comes through no listener and must not be asked for one.
		cfg := MuxConfig{Authorize: func(ctx context.Context, _, id, _ string) error {
			if _, ok := peer.FromContext(ctx); !ok {
				return status.Error(codes.Unauthenticated, "no caller")
			}
			c.mu.Lock()
			deaf := c.deaf[i] == id
			c.mu.Unlock()
			if deaf {
				return status.Error(codes.Unavailable, "link cut by the test")
			}
			return nil
		}}
		if tuneMux != nil {
			tuneMux(i, &cfg)
		}
		n := startTestNodeWith(t, cfg)
		c.nodes = append(c.nodes, n)
		peers = append(peers, raft.Server{ID: raft.ServerID(n.addr), Address: raft.ServerAddress(n.addr)})
	}
	for _, name := range names {
		for _, n := range c.nodes {
			tr, err := n.mux.Transport(name)
			if err != nil {
				t.Fatal(err)
			}
			rc := RaftConfig{ID: name, NodeID: raft.ServerID(n.addr),
				Dir: filepath.Join(t.TempDir(), name), Transport: tr, Peers: peers,
				HeartbeatTimeout: time.Second, ElectionTimeout: time.Second, LeaderLeaseTimeout: 500 * time.Millisecond}
			if tune != nil {
				tune(&rc)
			}
			g, err := OpenGroup(GroupConfig{RaftConfig: rc, Table: reptest.SGDTable("t", 2)})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { g.Close() })
			c.groups[name] = append(c.groups[name], g)
		}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			for _, gs := range c.groups {
				for i, g := range gs {
					c.mu.Lock()
					down := c.stopped[i] || c.deaf[i] != ""
					c.mu.Unlock()
					if !down {
						g.Tick(time.Now())
						if _, err := g.ExpediteElection(expediteSilence); err != nil {
							t.Log(err)
						}
					}
				}
			}
		}
	})
	t.Cleanup(func() { close(stop); wg.Wait() })
	return c
}

// stopNodes stops the nodes is as a kill would: their Mux stops, their
// replicas close, and the loop runs nothing on them any more.
func (c *expediteCluster) stopNodes(is ...int) {
	c.mu.Lock()
	for _, i := range is {
		c.stopped[i] = true
	}
	c.mu.Unlock()
	for _, i := range is {
		c.nodes[i].stop()
		for _, gs := range c.groups {
			gs[i].Close()
		}
	}
}

// leader waits for a ready leader of group name among the nodes not stopped
// and returns its node index and term.
func (c *expediteCluster) leader(name string, timeout time.Duration) (int, uint64) {
	c.t.Helper()
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		for i, g := range c.groups[name] {
			c.mu.Lock()
			down := c.stopped[i]
			c.mu.Unlock()
			if !down && g.IsLeader() && g.readyTerm.Load() != 0 {
				return i, g.raft.CurrentTerm()
			}
		}
	}
	c.t.Fatalf("group %s: no ready leader within %s", name, timeout)
	return -1, 0
}

// TestExpeditedElectionReplacesSilentLeader: a live leader is left alone
// however long the loop runs; when its node goes silent, a follower starts
// the election itself well before raft's own 1–3 s timer would, and pushes
// go on at the new leader.
func TestExpeditedElectionReplacesSilentLeader(t *testing.T) {
	c := newExpediteCluster(t, "e/0")
	first, term := c.leader("e/0", 10*time.Second)
	before := ExpeditedElections()
	time.Sleep(1500 * time.Millisecond)
	if l, tm := c.leader("e/0", time.Second); l != first || tm != term {
		t.Fatalf("a live leader was replaced: node %d term %d, then node %d term %d", first, term, l, tm)
	}
	if n := ExpeditedElections() - before; n != 0 {
		t.Fatalf("%d elections started against a live leader", n)
	}

	killed := time.Now()
	c.stopNodes(first)
	next, nterm := c.leader("e/0", 10*time.Second)
	t.Logf("leader's node stopped; node %d leads term %d after %s", next, nterm, time.Since(killed).Round(time.Millisecond))
	if ExpeditedElections() == before {
		t.Fatal("the new leader was elected by raft's own timer: no election was expedited")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.groups["e/0"][next].Push(ctx, &Push{Client: 1, Seq: 1, Keys: []uint64{7}, Grads: []float32{1, 2}}); err != nil {
		t.Fatalf("push at the new leader: %v", err)
	}
}

// TestExpeditedElectionNeedsASilentNode: when only one group's leader goes
// (its replica closed) while its node still leads another group, followers
// keep hearing from the node, so they leave the election to raft's timer.
func TestExpeditedElectionNeedsASilentNode(t *testing.T) {
	c := newExpediteCluster(t, "a/0", "b/0")
	la, _ := c.leader("a/0", 10*time.Second)
	// Put b/0's leadership on the same node, so that node keeps talking.
	for deadline := time.Now().Add(10 * time.Second); ; {
		lb, _ := c.leader("b/0", 5*time.Second)
		if lb == la {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("could not move b/0's leadership")
		}
		id := raft.ServerID(c.nodes[la].addr)
		if err := c.groups["b/0"][lb].raft.LeadershipTransferToServer(id, raft.ServerAddress(id)).Error(); err != nil {
			t.Logf("transfer: %v", err)
		}
	}
	before := ExpeditedElections()
	c.groups["a/0"][la].Close()
	// Exclude the closed replica from the leader search only.
	var next int
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		found := false
		for i, g := range c.groups["a/0"] {
			if i != la && g.IsLeader() && g.readyTerm.Load() != 0 {
				next, found = i, true
			}
		}
		if found {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a/0: no new leader")
		}
	}
	if n := ExpeditedElections() - before; n != 0 {
		t.Fatalf("%d elections expedited although the leader's node was heard from", n)
	}
	t.Logf("a/0: node %d took over by raft's timer", next)
}

// TestExpeditedElectionAfterAFailedOne: the leader's node dies while the
// follower ranked first to replace it lacks the last entries, so its
// expedited election fails (the other follower's log is longer). That
// election makes the other follower forget the leader; it must still
// start its own election at once, as the dead leader's follower, not wait
// for raft's 1–3 s timer.
func TestExpeditedElectionAfterAFailedOne(t *testing.T) {
	c := newExpediteCluster(t, "f/0")
	lead, _ := c.leader("f/0", 10*time.Second)
	var followers []int
	for i := range c.nodes {
		if i != lead {
			followers = append(followers, i)
		}
	}
	// Ranked by ID among the voters other than the leader.
	if c.nodes[followers[1]].addr < c.nodes[followers[0]].addr {
		followers[0], followers[1] = followers[1], followers[0]
	}
	behind, ahead := followers[0], followers[1]
	leaderID := c.nodes[lead].addr
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	g := c.groups["f/0"][lead]
	if _, err := g.Push(ctx, &Push{Client: 1, Seq: 1, Keys: []uint64{1}, Grads: []float32{1, 1}}); err != nil {
		t.Fatal(err)
	}
	// Well under raft's 1 s heartbeat timeout, so the deaf follower's own
	// timer does not fire before the leader dies.
	c.mu.Lock()
	c.deaf[behind] = leaderID
	c.mu.Unlock()
	for seq := uint64(2); seq <= 4; seq++ {
		if _, err := g.Push(ctx, &Push{Client: 1, Seq: seq, Keys: []uint64{1}, Grads: []float32{1, 1}}); err != nil {
			t.Fatal(err)
		}
	}
	before := ExpeditedElections()
	c.mu.Lock()
	c.stopped[lead] = true
	delete(c.deaf, behind)
	c.mu.Unlock()
	killed := time.Now()
	c.nodes[lead].stop()
	g.Close()

	next, term := c.leader("f/0", 10*time.Second)
	took := time.Since(killed).Round(time.Millisecond)
	n := ExpeditedElections() - before
	t.Logf("node %d leads term %d %s after the kill; %d elections expedited", next, term, took, n)
	if next != ahead {
		t.Fatalf("node %d leads, not the follower with the longer log (%d)", next, ahead)
	}
	if n < 2 {
		t.Fatalf("%d elections expedited: the follower with the longer log waited for raft's timer after the first failed", n)
	}
	if _, err := c.groups["f/0"][next].Push(ctx, &Push{Client: 1, Seq: 5, Keys: []uint64{1}, Grads: []float32{1, 1}}); err != nil {
		t.Fatalf("push at the new leader: %v", err)
	}
}

// TestHearingNeedsAStreak: a peer counts toward an expedited election's
// majority only when this node has heard from it without a gap for four
// ping intervals, so a node whose cut just healed, hearing the other
// followers again a moment before the leader's node, does not take the
// leader for dead.
func TestHearingNeedsAStreak(t *testing.T) {
	n := startTestNode(t)
	m := n.mux
	ping := m.cfg.PingInterval
	gap := int64(4 * ping)
	peer := raft.ServerAddress("127.0.0.1:1")
	now := time.Now()
	if m.hearing(peer, now, time.Second) {
		t.Fatal("a peer never heard from counts as heard")
	}
	h := new(peerHeard)
	m.heard.Store(peer, h)
	at := func(d time.Duration) int64 { return now.Add(d).UnixNano() }

	// Heard every ping interval for a second: a streak.
	for d := -time.Second; d <= 0; d += ping {
		h.note(at(d), gap)
	}
	if !m.hearing(peer, now, 200*time.Millisecond) {
		t.Fatal("a peer heard every ping interval for a second does not count")
	}
	if m.hearing(peer, now.Add(120*time.Millisecond), 200*time.Millisecond) {
		t.Fatal("a peer silent for more than half the silence counts: a node cut off from everyone would count it")
	}

	// Silent for 3 s (a cut), then heard again a moment ago: not yet.
	h.note(at(3*time.Second), gap)
	later := now.Add(3*time.Second + 10*time.Millisecond)
	if m.hearing(peer, later, 200*time.Millisecond) {
		t.Fatal("a peer heard again 10 ms after a 3 s gap counts at once")
	}
	for d := 3*time.Second + ping; d <= 3*time.Second+5*ping; d += ping {
		h.note(at(d), gap)
	}
	if !m.hearing(peer, now.Add(3*time.Second+5*ping), 200*time.Millisecond) {
		t.Fatal("a peer heard for five ping intervals after a gap does not count")
	}
}

// TestRefusedTransferVoteSkipsTheStagger: a follower that refused an
// expedited election's vote because the candidate's log ends before its
// own expedites without its rank's stagger, within the silence of the
// refusal; a refusal of a candidate as far along, an older refusal, or a
// refused vote that was not a transfer's, leaves the stagger.
func TestRefusedTransferVoteSkipsTheStagger(t *testing.T) {
	c := newExpediteCluster(t, "v/0")
	lead, _ := c.leader("v/0", 10*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.groups["v/0"][lead].Push(ctx, &Push{Client: 1, Seq: 1, Keys: []uint64{1}, Grads: []float32{1, 1}}); err != nil {
		t.Fatal(err)
	}
	g := c.groups["v/0"][(lead+1)%len(c.nodes)]
	r := g.replica
	tr := r.cfg.Transport.(*Transport)
	var term, index uint64
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		s := r.Raft.Stats()
		term, _ = strconv.ParseUint(s["last_log_term"], 10, 64)
		index, _ = strconv.ParseUint(s["last_log_index"], 10, 64)
		if index >= 3 || time.Now().After(deadline) {
			break
		}
	}
	now := time.Now()
	refuse := func(transfer bool, lastTerm, lastIndex uint64) bool {
		tr.refusedTransfer.Store(nil)
		tr.noteRefusedTransfer(&raft.RequestVoteRequest{LeadershipTransfer: transfer, LastLogTerm: lastTerm, LastLogIndex: lastIndex},
			&raft.RequestVoteResponse{Granted: false})
		return r.refusedShorterLog(tr, now, expediteSilence)
	}
	if !refuse(true, term, index-1) {
		t.Error("a transfer vote refused to a candidate an entry behind does not skip the stagger")
	}
	if !refuse(true, term-1, index+5) {
		t.Error("a transfer vote refused to a candidate of an older last term does not skip the stagger")
	}
	if refuse(true, term, index) {
		t.Error("a candidate as far along skips the stagger")
	}
	if refuse(false, term, index-1) {
		t.Error("a refused vote that was not a transfer's skips the stagger")
	}
	tr.noteRefusedTransfer(&raft.RequestVoteRequest{LeadershipTransfer: true, LastLogTerm: term, LastLogIndex: index - 1}, &raft.RequestVoteResponse{Granted: false})
	if r.refusedShorterLog(tr, now.Add(expediteSilence+time.Millisecond), expediteSilence) {
		t.Error("a refusal older than the silence skips the stagger")
	}
	tr.refusedTransfer.Store(nil)
	tr.noteRefusedTransfer(&raft.RequestVoteRequest{LeadershipTransfer: true, LastLogTerm: term, LastLogIndex: index - 1}, &raft.RequestVoteResponse{Granted: true})
	if r.refusedShorterLog(tr, now, expediteSilence) {
		t.Error("a granted vote counts as refused")
	}
}
