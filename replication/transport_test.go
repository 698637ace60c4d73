package replication

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/raftps/raftps/replication/transportpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

func randBytes(rng *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

// TestMessagesRoundTrip: every field of every Raft message survives the
// transport's encoding. Fields are set to random values, so a dropped one shows.
func TestMessagesRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	hdr := func() raft.RPCHeader {
		return raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: randBytes(rng, 5), Addr: randBytes(rng, 9)}
	}
	for range 20 {
		var entries []*raft.Log
		for i := range rng.IntN(4) {
			entries = append(entries, &raft.Log{Index: rng.Uint64(), Term: rng.Uint64(), Type: raft.LogType(i % 3),
				Data: randBytes(rng, rng.IntN(100)), Extensions: randBytes(rng, rng.IntN(5)),
				AppendedAt: time.Unix(0, rng.Int64N(1<<60)).UTC()})
		}
		msgs := []any{
			&raft.AppendEntriesRequest{RPCHeader: hdr(), Term: rng.Uint64(), PrevLogEntry: rng.Uint64(), PrevLogTerm: rng.Uint64(),
				Entries: entries, LeaderCommitIndex: rng.Uint64()},
			&raft.AppendEntriesResponse{RPCHeader: hdr(), Term: rng.Uint64(), LastLog: rng.Uint64(), Success: rng.IntN(2) == 1, NoRetryBackoff: rng.IntN(2) == 1},
			&raft.RequestVoteRequest{RPCHeader: hdr(), Term: rng.Uint64(), LastLogIndex: rng.Uint64(), LastLogTerm: rng.Uint64(), LeadershipTransfer: rng.IntN(2) == 1},
			&raft.RequestVoteResponse{RPCHeader: hdr(), Term: rng.Uint64(), Granted: rng.IntN(2) == 1},
			&raft.RequestPreVoteRequest{RPCHeader: hdr(), Term: rng.Uint64(), LastLogIndex: rng.Uint64(), LastLogTerm: rng.Uint64()},
			&raft.RequestPreVoteResponse{RPCHeader: hdr(), Term: rng.Uint64(), Granted: rng.IntN(2) == 1},
			&raft.TimeoutNowRequest{RPCHeader: hdr()},
			&raft.TimeoutNowResponse{RPCHeader: hdr()},
			&raft.InstallSnapshotRequest{RPCHeader: hdr(), SnapshotVersion: 1, Term: rng.Uint64(), LastLogIndex: rng.Uint64(),
				LastLogTerm: rng.Uint64(), Configuration: randBytes(rng, 20), ConfigurationIndex: rng.Uint64(), Size: rng.Int64()},
			&raft.InstallSnapshotResponse{RPCHeader: hdr(), Term: rng.Uint64(), Success: rng.IntN(2) == 1},
		}
		for _, m := range msgs {
			b, err := encode(m)
			if err != nil {
				t.Fatal(err)
			}
			got := reflect.New(reflect.TypeOf(m).Elem()).Interface()
			if err := decode(b, got); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, m) {
				t.Fatalf("%T changed in transit:\n got %+v\nwant %+v", m, got, m)
			}
		}
	}
}

// testNode is one node of the transport tests: a gRPC server and a Mux.
type testNode struct {
	addr   string
	server *grpc.Server
	mux    *Mux
}

func startTestNode(t *testing.T) *testNode {
	t.Helper()
	return startTestNodeWith(t, MuxConfig{})
}

// startTestNodeWith starts a node whose Mux has cfg, LocalAddr filled in.
func startTestNodeWith(t *testing.T, cfg MuxConfig) *testNode {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	n := &testNode{addr: lis.Addr().String(), server: grpc.NewServer(ServerOptions()...)}
	cfg.LocalAddr = raft.ServerAddress(n.addr)
	if n.mux, err = NewMux(cfg); err != nil {
		t.Fatal(err)
	}
	n.mux.Register(n.server)
	go n.server.Serve(lis)
	t.Cleanup(n.stop)
	return n
}

func (n *testNode) stop() {
	n.server.Stop()
	n.mux.Close()
}

// bigFSM sums the distinct values it is given (so a command retried after a
// leader change counts once); its snapshot is padded to a few MiB so that
// installing it takes several chunks.
type bigFSM struct {
	mu   sync.Mutex
	seen map[uint64]bool
	sum  uint64
	n    int
}

func (f *bigFSM) Apply(l *raft.Log) any {
	f.mu.Lock()
	defer f.mu.Unlock()
	v := binary.LittleEndian.Uint64(l.Data)
	if f.seen == nil {
		f.seen = map[uint64]bool{}
	}
	if !f.seen[v] {
		f.seen[v] = true
		f.sum += v
		f.n++
	}
	return nil
}

func (f *bigFSM) state() (uint64, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.sum, f.n
}

const snapPad = 5 << 20

func (f *bigFSM) Snapshot() (raft.FSMSnapshot, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	// sum, n, the values seen (so a value retried after the snapshot still
	// counts once), then padding up to a fixed size.
	b := make([]byte, 16, 16+8*len(f.seen)+snapPad)
	binary.LittleEndian.PutUint64(b, f.sum)
	binary.LittleEndian.PutUint64(b[8:], uint64(f.n))
	for v := range f.seen {
		b = binary.LittleEndian.AppendUint64(b, v)
	}
	for i := len(b); i < 16+8*len(f.seen)+snapPad; i++ {
		b = append(b, byte(i))
	}
	return bigSnap(b), nil
}

func (f *bigFSM) Restore(rc io.ReadCloser) error {
	b, err := io.ReadAll(rc)
	if err != nil {
		return err
	}
	if len(b) < 16 {
		return fmt.Errorf("snapshot of %d bytes arrived damaged", len(b))
	}
	n := int(binary.LittleEndian.Uint64(b[8:]))
	if len(b) != 16+8*n+snapPad || b[len(b)-1] != byte(len(b)-1) {
		return fmt.Errorf("snapshot of %d bytes arrived damaged", len(b))
	}
	f.mu.Lock()
	f.sum, f.n = binary.LittleEndian.Uint64(b), n
	f.seen = make(map[uint64]bool, n)
	for i := range n {
		f.seen[binary.LittleEndian.Uint64(b[16+8*i:])] = true
	}
	f.mu.Unlock()
	return nil
}

type bigSnap []byte

func (s bigSnap) Persist(sink raft.SnapshotSink) error {
	if _, err := sink.Write(s); err != nil {
		sink.Cancel()
		return err
	}
	return sink.Close()
}
func (bigSnap) Release() {}

type testReplica struct {
	r   *raft.Raft
	fsm *bigFSM
}

func startReplica(t *testing.T, n *testNode, group string, peers []raft.Server) *testReplica {
	t.Helper()
	tr, err := n.mux.Transport(group)
	if err != nil {
		t.Fatal(err)
	}
	f := &bigFSM{}
	rep, err := OpenRaft(RaftConfig{ID: group, NodeID: raft.ServerID(n.addr), Dir: filepath.Join(t.TempDir(), group), Transport: tr, Peers: peers,
		// Lenient timing: this tests the transport, not failover speed, and
		// must hold under the race detector on two cores.
		HeartbeatTimeout: time.Second, ElectionTimeout: time.Second, LeaderLeaseTimeout: 500 * time.Millisecond,
		// Snapshots only when the test takes one. Automatic ones every 50
		// entries, of this FSM's padded 5 MiB, kept six replicas writing
		// and streaming snapshots all the time: under -race next to other
		// tests, heartbeats then took longer than the lease and the
		// groups went leaderless for seconds (the test's old flakiness).
		CommitTimeout: 5 * time.Millisecond, SnapshotThreshold: 1 << 40, TrailingLogs: 10, SnapshotInterval: time.Hour}, f)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rep.Close() })
	return &testReplica{r: rep.Raft, fsm: f}
}

// startGroup starts group on every node, all of them voters, and returns
// its replicas (by node) and the voters.
func startGroup(t *testing.T, nodes []*testNode, group string) ([]*testReplica, []raft.Server) {
	t.Helper()
	var peers []raft.Server
	for _, n := range nodes {
		peers = append(peers, raft.Server{ID: raft.ServerID(n.addr), Address: raft.ServerAddress(n.addr)})
	}
	var reps []*testReplica
	for _, n := range nodes {
		reps = append(reps, startReplica(t, n, group, peers))
	}
	return reps, peers
}

func waitLeader(t *testing.T, reps []*testReplica) *testReplica {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		for _, r := range reps {
			if r.r.State() == raft.Leader {
				return r
			}
		}
	}
	t.Fatal("no leader")
	return nil
}

// TestTransportTwoGroupsAndSnapshotInstall runs two Raft groups on the same
// three nodes over one port each, then adds a fourth node that can only
// catch up by a snapshot streamed in chunks.
func TestTransportTwoGroupsAndSnapshotInstall(t *testing.T) {
	nodes := []*testNode{startTestNode(t), startTestNode(t), startTestNode(t)}
	groups := map[string][]*testReplica{}
	for _, g := range []string{"a/0", "b/0"} {
		groups[g], _ = startGroup(t, nodes, g)
	}
	var want = map[string]uint64{}
	var wg sync.WaitGroup
	var mu sync.Mutex
	for g, reps := range groups {
		wg.Go(func() {
			// Pipelined applies in rounds; whatever a leader change left
			// unacknowledged is sent again (the FSM ignores repeats).
			pending := make([]uint64, 2000)
			var sum uint64
			for i := range pending {
				pending[i] = uint64(i) + 1
				sum += uint64(i) + 1
			}
			for deadline := time.Now().Add(30 * time.Second); len(pending) > 0; {
				if time.Now().After(deadline) {
					t.Errorf("group %s: %d applies never acknowledged", g, len(pending))
					return
				}
				l := waitLeader(t, reps)
				futures := make([]raft.ApplyFuture, len(pending))
				for i, v := range pending {
					futures[i] = l.r.Apply(binary.LittleEndian.AppendUint64(nil, v), 5*time.Second)
				}
				var again []uint64
				for i, f := range futures {
					if f.Error() != nil {
						again = append(again, pending[i])
					}
				}
				pending = again
			}
			mu.Lock()
			want[g] = sum
			mu.Unlock()
		})
	}
	wg.Wait()
	for g, reps := range groups {
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			done := true
			for _, r := range reps {
				if sum, _ := r.fsm.state(); sum != want[g] {
					done = false
				}
			}
			if done {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("group %s did not converge", g)
			}
		}
	}
	var pipelined int64
	for _, n := range nodes {
		pipelined += n.mux.Stats().PipelinedAppends.Load()
	}
	if pipelined == 0 {
		t.Error("no AppendEntries went over a pipeline stream")
	}
	// Compact group a's log, then add a fourth node: only a snapshot helps it.
	la := waitLeader(t, groups["a/0"])
	if err := la.r.Snapshot().Error(); err != nil {
		t.Fatal(err)
	}
	n4 := startTestNode(t)
	r4 := startReplica(t, n4, "a/0", nil)
	if err := la.r.AddVoter(raft.ServerID(n4.addr), raft.ServerAddress(n4.addr), 0, 5*time.Second).Error(); err != nil {
		t.Fatal(err)
	}
	// Raft restores the FSM before it answers the InstallSnapshot RPC, so the
	// counter can trail the state by a moment.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if sum, _ := r4.fsm.state(); sum == want["a/0"] && n4.mux.Stats().SnapshotsReceived.Load() > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("new voter did not catch up: %v", r4.r.Stats())
		}
	}
	if got := n4.mux.Stats().SnapshotsReceived.Load(); got == 0 {
		t.Fatal("the new voter caught up without InstallSnapshot")
	}
	if b := n4.mux.Stats().SnapshotBytes.Load(); b < snapPad {
		t.Fatalf("only %d snapshot bytes streamed", b)
	}
}

func TestTransportUnknownGroupAndClose(t *testing.T) {
	n := startTestNode(t)
	cc, err := grpc.NewClient(n.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	c := transportpb.NewRaftTransportClient(cc)
	req, _ := encode(&raft.RequestVoteRequest{Term: 1})
	_, err = c.RequestVote(context.Background(), &transportpb.RPC{Group: "nope", Msgpack: req})
	if status.Code(err) != codes.NotFound || !bytes.Contains([]byte(err.Error()), []byte(`"nope"`)) {
		t.Fatalf("unknown group: %v", err)
	}
	_, err = c.RequestVote(context.Background(), &transportpb.RPC{Group: "", Msgpack: req})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("no group: %v", err)
	}
	tr, err := n.mux.Transport("g")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.mux.Transport("g"); !errors.Is(err, ErrGroupExists) {
		t.Fatalf("second open: %v", err)
	}
	_, err = c.RequestVote(context.Background(), &transportpb.RPC{Group: "g", Msgpack: []byte{0xc1}})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("garbage payload: %v", err)
	}
	tr.Close()
	var resp raft.RequestVoteResponse
	if err := tr.RequestVote("x", raft.ServerAddress(n.addr), &raft.RequestVoteRequest{}, &resp); !errors.Is(err, ErrTransportClosed) {
		t.Fatalf("call on a closed transport: %v", err)
	}
	if _, err := c.RequestVote(context.Background(), &transportpb.RPC{Group: "g", Msgpack: req}); status.Code(err) != codes.NotFound {
		t.Fatalf("RPC to a closed group: %v", err)
	}
}

// TestTransportCloseEndsCallsInFlight: a call to a peer that takes it but
// never answers (a frozen process, or a partition after the connection was
// made) ends as soon as the calling transport is closed, with
// ErrTransportClosed, not after its timeout: raft's Shutdown waits for the
// replicator making it, and a node closes its groups one by one. Both kinds
// of call: an append (a unary call, Timeout) and a heartbeat (through the
// peer's coalescer, HeartbeatTimeout; both 5 s here). The peer's transport
// has no raft on it, so nothing answers the request.
func TestTransportCloseEndsCallsInFlight(t *testing.T) {
	for _, tc := range []struct {
		name string
		req  *raft.AppendEntriesRequest
	}{
		{"append", &raft.AppendEntriesRequest{Term: 1, PrevLogEntry: 1, PrevLogTerm: 1}},
		{"heartbeat", &raft.AppendEntriesRequest{RPCHeader: raft.RPCHeader{Addr: []byte("a"), ID: []byte("a")}, Term: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if isHeartbeat(tc.req) != (tc.name == "heartbeat") {
				t.Fatalf("isHeartbeat(%+v) = %v", tc.req, isHeartbeat(tc.req))
			}
			// b's group never answers: it has no heartbeat handler and no
			// raft reading its consumer, and b answers a heartbeat batch
			// only after half its heartbeat timeout.
			b := startTestNodeWith(t, MuxConfig{HeartbeatTimeout: 10 * time.Second})
			m, err := NewMux(MuxConfig{LocalAddr: "127.0.0.1:1", Timeout: 5 * time.Second, HeartbeatTimeout: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			ta, err := m.Transport("g")
			if err != nil {
				t.Fatal(err)
			}
			if _, err := b.mux.Transport("g"); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() {
				var resp raft.AppendEntriesResponse
				done <- ta.AppendEntries("b", raft.ServerAddress(b.addr), tc.req, &resp)
			}()
			select {
			case err := <-done:
				t.Fatalf("the call to a peer that never answers returned: %v", err)
			case <-time.After(300 * time.Millisecond):
			}
			start := time.Now()
			ta.Close()
			select {
			case err := <-done:
				if !errors.Is(err, ErrTransportClosed) {
					t.Fatalf("call cut short by Close: %v, want ErrTransportClosed", err)
				}
				t.Logf("call ended %s after Close", time.Since(start).Round(time.Microsecond))
			case <-time.After(2 * time.Second):
				t.Fatal("the call in flight outlived its transport's Close")
			}
		})
	}
}

// TestHeartbeatsCoalesce: heartbeats that groups send to one peer at the same
// moment share messages, every one is answered by its own group's handler
// (the answer carries the group's term back), and a heartbeat for a group the
// peer does not hold fails alone while the others succeed.
func TestHeartbeatsCoalesce(t *testing.T) {
	a, b := startTestNode(t), startTestNode(t)
	const groups, rounds = 8, 20
	var senders []*Transport
	for g := range groups {
		name := fmt.Sprintf("g%d", g)
		recv, err := b.mux.Transport(name)
		if err != nil {
			t.Fatal(err)
		}
		// A slow handler, so heartbeats pile up behind a message in flight.
		recv.SetHeartbeatHandler(func(rpc raft.RPC) {
			req := rpc.Command.(*raft.AppendEntriesRequest)
			time.Sleep(2 * time.Millisecond)
			rpc.Respond(&raft.AppendEntriesResponse{Term: req.Term, Success: true}, nil)
		})
		send, err := a.mux.Transport(name)
		if err != nil {
			t.Fatal(err)
		}
		senders = append(senders, send)
	}
	lost, err := a.mux.Transport("not-on-b")
	if err != nil {
		t.Fatal(err)
	}
	hb := func(term uint64) *raft.AppendEntriesRequest {
		return &raft.AppendEntriesRequest{RPCHeader: raft.RPCHeader{Addr: []byte(a.addr)}, Term: term}
	}
	var wg sync.WaitGroup
	errs := make(chan error, groups*rounds+1)
	for g, tr := range senders {
		wg.Go(func() {
			for r := range rounds {
				term := uint64(1000*g + r + 1)
				var resp raft.AppendEntriesResponse
				if err := tr.AppendEntries("b", raft.ServerAddress(b.addr), hb(term), &resp); err != nil {
					errs <- err
				} else if resp.Term != term || !resp.Success {
					errs <- fmt.Errorf("group %d sent term %d, got answer %+v", g, term, resp)
				}
			}
		})
	}
	wg.Go(func() {
		var resp raft.AppendEntriesResponse
		err := lost.AppendEntries("b", raft.ServerAddress(b.addr), hb(1), &resp)
		if err == nil || !strings.Contains(err.Error(), "not-on-b") {
			errs <- fmt.Errorf("heartbeat to a group the peer lacks: got %v, want an error naming it", err)
		}
	})
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	sent, msgs := a.mux.Stats().HeartbeatsSent.Load(), a.mux.Stats().HeartbeatBatches.Load()
	if sent != groups*rounds+1 {
		t.Fatalf("%d heartbeats counted, sent %d", sent, groups*rounds+1)
	}
	if msgs >= sent {
		t.Fatalf("%d heartbeats took %d messages: none were coalesced", sent, msgs)
	}
	t.Logf("%d heartbeats in %d messages", sent, msgs)
}

// TestTransportCloseWaitsForHeartbeats: Close returns only once a heartbeat
// already in the handler has left it, and no heartbeat enters after. raft's
// Shutdown does not wait for heartbeats (they run on the transport's
// goroutines), so without this a heartbeat could reach raft's stable store
// after the group closed it, and raft panics ("failed to save current
// term: database not open"; seen once in a full test run).
func TestTransportCloseWaitsForHeartbeats(t *testing.T) {
	m, err := NewMux(MuxConfig{LocalAddr: "127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	tr, err := m.Transport("g")
	if err != nil {
		t.Fatal(err)
	}
	entered, release := make(chan struct{}), make(chan struct{})
	var calls atomic.Int32
	tr.SetHeartbeatHandler(func(rpc raft.RPC) {
		if calls.Add(1) == 1 {
			close(entered)
			<-release
		}
		rpc.Respond(&raft.AppendEntriesResponse{Term: 1, Success: true}, nil)
	})
	hb := func() (any, error) {
		return tr.dispatch(context.Background(), &raft.AppendEntriesRequest{RPCHeader: raft.RPCHeader{Addr: []byte("peer")}, Term: 1}, nil)
	}
	first := make(chan error, 1)
	go func() { _, err := hb(); first <- err }()
	<-entered
	closed := make(chan struct{})
	go func() { tr.Close(); close(closed) }()
	select {
	case <-closed:
		t.Fatal("Close returned while a heartbeat was still in the handler")
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not return after the heartbeat left the handler")
	}
	// Its answer races with the closing (dispatch also waits on the
	// transport's end): either is fine.
	if err := <-first; err != nil && status.Code(err) != codes.NotFound {
		t.Errorf("the heartbeat in flight: %v", err)
	}
	if _, err := hb(); status.Code(err) != codes.NotFound {
		t.Errorf("heartbeat after Close: %v, want NotFound", err)
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("the handler ran %d times, want once (none after Close)", n)
	}
}
