package replication

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/raftps/raftps/replication/transportpb"
)

// idleTestGroup starts one group "idle/0" on three nodes of cfg and returns
// the nodes, the replicas (by node) and the leader's index, once every
// replica has applied n entries.
func idleTestGroup(t *testing.T, cfg MuxConfig, n int) ([]*testNode, []*testReplica, int) {
	t.Helper()
	nodes := []*testNode{startTestNodeWith(t, cfg), startTestNodeWith(t, cfg), startTestNodeWith(t, cfg)}
	reps, _ := startGroup(t, nodes, "idle/0")
	l := waitLeader(t, reps)
	for v := range n {
		if err := l.r.Apply(binary.LittleEndian.AppendUint64(nil, uint64(v+1)), 5*time.Second).Error(); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range reps {
		waitApplied(t, r, n)
	}
	for i, r := range reps {
		if r == l {
			return nodes, reps, i
		}
	}
	t.Fatal("leader is not one of the replicas")
	return nil, nil, 0
}

// waitApplied waits until r's FSM holds n values.
func waitApplied(t *testing.T, r *testReplica, n int) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, got := r.fsm.state(); got == n {
			return
		}
		if time.Now().After(deadline) {
			_, got := r.fsm.state()
			t.Fatalf("replica holds %d values, want %d", got, n)
		}
	}
}

// waitIdleAnswered waits until m has answered more idle appends locally
// than before.
func waitIdleAnswered(t *testing.T, m *Mux, before int64) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); m.Stats().IdleAppendsAnswered.Load() <= before; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no idle append was answered locally")
		}
	}
}

// TestIdleAppendsRepairAWipedFollower: while a group is idle its leader
// answers idle appends locally, and a follower replica that loses its
// state without its node going silent (closed, its directory discarded,
// opened again empty; the node's pings go on all along) still catches up
// with no new write: the refresh interval sends the append for real, the
// follower refuses it, and raft repairs it. If the remembered answer were
// trusted for ever, the follower would stay empty.
func TestIdleAppendsRepairAWipedFollower(t *testing.T) {
	const n = 5
	// Node liveness that never lapses, however loaded the machine: only
	// the refresh interval can send an idle append for real.
	nodes, reps, li := idleTestGroup(t, MuxConfig{IdleAppendRefresh: 500 * time.Millisecond, IdleAppendFresh: time.Hour}, n)
	lm := nodes[li].mux
	waitIdleAnswered(t, lm, lm.Stats().IdleAppendsAnswered.Load())

	f := (li + 1) % len(nodes)
	tr := nodes[f].mux
	tr.mu.RLock()
	old := tr.groups["idle/0"]
	tr.mu.RUnlock()
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}
	if err := reps[f].r.Shutdown().Error(); err != nil {
		t.Fatal(err)
	}
	// A new, empty directory (startReplica takes a fresh TempDir) and no
	// peers: the replica waits for the leader to fill it.
	wiped := startReplica(t, nodes[f], "idle/0", nil)
	waitApplied(t, wiped, n)
}

// TestIdleAppendsNeedALiveNode: idle appends are answered locally only
// while the follower's node is heard from. A leader whose followers' nodes
// all stopped must lose its lease and step down, even with a refresh
// interval far longer than the test: were the remembered answers given
// regardless, raft would take each for contact with the follower and lead
// on for ever.
func TestIdleAppendsNeedALiveNode(t *testing.T) {
	nodes, reps, li := idleTestGroup(t, MuxConfig{IdleAppendRefresh: time.Hour}, 3)
	lm := nodes[li].mux
	waitIdleAnswered(t, lm, lm.Stats().IdleAppendsAnswered.Load())
	for i, nd := range nodes {
		if i != li {
			nd.stop()
		}
	}
	for deadline := time.Now().Add(20 * time.Second); reps[li].r.State() == raft.Leader; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the leader kept its lease with every follower's node stopped")
		}
	}
}

// TestPingsKeepIdlePeersHeard: two nodes whose groups send nothing to each
// other still hear from each other, by pings alone.
func TestPingsKeepIdlePeersHeard(t *testing.T) {
	a, b := startTestNodeWith(t, MuxConfig{PingInterval: 10 * time.Millisecond}), startTestNode(t)
	a.mux.heardFrom(raft.ServerAddress(b.addr)) // as the first message of a group would
	for deadline := time.Now().Add(10 * time.Second); a.mux.Stats().Pings.Load() < 3; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d pings answered", a.mux.Stats().Pings.Load())
		}
	}
	b.stop()
	// Once b is gone its pings fail, LastHeard ages, and b counts as silent.
	for deadline := time.Now().Add(10 * time.Second); !a.mux.AnySilent(200 * time.Millisecond); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("a stopped peer is still heard from")
		}
	}
}

// TestHeartbeatsWaitForOthers: raft's periodic heartbeats to a peer wait
// (HeartbeatDelay, here longer than the test) for other groups' to share a
// message, and a leadership check does not wait: it takes everything
// queued along at once. Every heartbeat is answered by its own group.
func TestHeartbeatsWaitForOthers(t *testing.T) {
	a, b := startTestNodeWith(t, MuxConfig{HeartbeatDelay: time.Hour}), startTestNode(t)
	const groups = 3
	var senders []*Transport
	for g := range groups {
		name := fmt.Sprintf("g%d", g)
		recv, err := b.mux.Transport(name)
		if err != nil {
			t.Fatal(err)
		}
		recv.SetHeartbeatHandler(func(rpc raft.RPC) {
			req := rpc.Command.(*raft.AppendEntriesRequest)
			rpc.Respond(&raft.AppendEntriesResponse{Term: req.Term, Success: true}, nil)
		})
		send, err := a.mux.Transport(name)
		if err != nil {
			t.Fatal(err)
		}
		// As OpenRaft does for a group whose heartbeat timeout is long.
		send.mayDelay.Store(true)
		senders = append(senders, send)
	}
	hb := func(term uint64) *raft.AppendEntriesRequest {
		return &raft.AppendEntriesRequest{RPCHeader: raft.RPCHeader{Addr: []byte(a.addr)}, Term: term}
	}
	target := raft.ServerAddress(b.addr)
	var wg sync.WaitGroup
	errs := make(chan error, groups)
	for g, tr := range senders[:groups-1] {
		wg.Go(func() {
			var resp raft.AppendEntriesResponse
			if err := tr.AppendEntries("b", target, hb(uint64(g+1)), &resp); err != nil {
				errs <- err
			} else if resp.Term != uint64(g+1) {
				errs <- fmt.Errorf("group %d got the answer of term %d", g, resp.Term)
			}
		})
	}
	h := a.mux.heartbeatsTo(target)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		h.mu.Lock()
		queued := len(h.queue)
		h.mu.Unlock()
		if queued == groups-1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d heartbeats queued, want %d", queued, groups-1)
		}
	}
	if n := a.mux.Stats().HeartbeatBatches.Load(); n != 0 {
		t.Fatalf("%d messages sent before the delay or a leadership check", n)
	}
	var resp raft.AppendEntriesResponse
	if err := senders[groups-1].heartbeatNow("b", target, hb(groups), &resp); err != nil || resp.Term != groups {
		t.Fatalf("leadership check: %v, answer %+v", err, resp)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if sent, msgs := a.mux.Stats().HeartbeatsSent.Load(), a.mux.Stats().HeartbeatBatches.Load(); sent != groups || msgs != 1 {
		t.Fatalf("%d heartbeats in %d messages, want %d in 1", sent, msgs, groups)
	}
}

// TestSlowHeartbeatFailsAlone: a heartbeat batch is answered after half
// the receiver's heartbeat timeout at the latest; a group whose raft is
// stuck (as one writing a new term to a slow disk) fails alone, and the
// others in its batch are answered.
func TestSlowHeartbeatFailsAlone(t *testing.T) {
	a, b := startTestNode(t), startTestNodeWith(t, MuxConfig{HeartbeatTimeout: 200 * time.Millisecond})
	stuck := make(chan struct{})
	defer close(stuck)
	for g, slow := range []bool{false, true} {
		recv, err := b.mux.Transport(fmt.Sprintf("g%d", g))
		if err != nil {
			t.Fatal(err)
		}
		recv.SetHeartbeatHandler(func(rpc raft.RPC) {
			if slow {
				<-stuck
			}
			rpc.Respond(&raft.AppendEntriesResponse{Term: 1, Success: true}, nil)
		})
	}
	payload, err := encode(&raft.AppendEntriesRequest{RPCHeader: raft.RPCHeader{ID: []byte(a.addr), Addr: []byte(a.addr)}, Term: 1})
	if err != nil {
		t.Fatal(err)
	}
	c, err := a.mux.client(raft.ServerAddress(b.addr))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := c.Heartbeats(ctx, &transportpb.HeartbeatBatch{Rpcs: []*transportpb.RPC{{Group: "g0", Msgpack: payload}, {Group: "g1", Msgpack: payload}}})
	if err != nil {
		t.Fatalf("batch with one stuck group: %v", err)
	}
	if len(out.Rpcs) != 2 || out.Rpcs[0].Error != "" || out.Rpcs[1].Error == "" {
		t.Fatalf("answers %v: want g0 answered and g1 failed", out.Rpcs)
	}
}
