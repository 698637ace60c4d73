package replication

import (
	"context"
	"fmt"
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
	"google.golang.org/protobuf/proto"
)

// TestLargestAppendEntries measures the largest Raft message a node sends:
// an AppendEntries of MaxAppendEntries entries of MaxGroupEntryBytes each.
// It must fit the peer listener's MaxRaftMessageBytes, which is set from it.
func TestLargestAppendEntries(t *testing.T) {
	data := make([]byte, MaxGroupEntryBytes) // shared by every entry: the encoding copies it
	req := &raft.AppendEntriesRequest{RPCHeader: raft.RPCHeader{ID: []byte("node-with-a-long-id"), Addr: []byte("255.255.255.255:65535")},
		Term: 1 << 62, PrevLogEntry: 1 << 62, PrevLogTerm: 1 << 62, LeaderCommitIndex: 1 << 62}
	for i := range MaxAppendEntries {
		req.Entries = append(req.Entries, &raft.Log{Index: 1<<62 + uint64(i), Term: 1 << 62, Type: raft.LogCommand, Data: data,
			Extensions: make([]byte, 64), AppendedAt: time.Now()})
	}
	b, err := encode(req)
	if err != nil {
		t.Fatal(err)
	}
	size := proto.Size(&transportpb.RPC{Group: "a-table-name-of-sixty-four-characters-which-is-long-enough/1023", Msgpack: b})
	t.Logf("largest AppendEntries: %d bytes (%d entries of %d), limit %d", size, MaxAppendEntries, MaxGroupEntryBytes, MaxRaftMessageBytes)
	if size > MaxRaftMessageBytes {
		t.Fatalf("the largest AppendEntries is %d bytes, over MaxRaftMessageBytes %d", size, MaxRaftMessageBytes)
	}
	if over := size - MaxAppendEntries*MaxGroupEntryBytes; over > 64<<10 {
		t.Fatalf("headers of %d bytes: the 1 MiB of room in MaxRaftMessageBytes may be too little", over)
	}
}

// TestHeartbeatBatchLimits: a heartbeat batch of MaxHeartbeatBatch is
// answered whole, HeartbeatWorkers at a time at most; one more is refused
// with ResourceExhausted naming the limit; and a sender with more
// heartbeats queued than one batch holds sends several messages, all
// answered.
func TestHeartbeatBatchLimits(t *testing.T) {
	a, b := startTestNode(t), startTestNode(t)
	// A sender whose messages may take long: this machine may be loaded,
	// and what is tested is how heartbeats are cut into messages.
	var err error
	a.mux.Close()
	if a.mux, err = NewMux(MuxConfig{LocalAddr: raft.ServerAddress(a.addr), HeartbeatTimeout: 20 * time.Second}); err != nil {
		t.Fatal(err)
	}
	recv, err := b.mux.Transport("g")
	if err != nil {
		t.Fatal(err)
	}
	var running, most atomic.Int64
	var slow atomic.Bool // while the batch at the limit is served: long enough to overlap
	slow.Store(true)
	recv.SetHeartbeatHandler(func(rpc raft.RPC) {
		n := running.Add(1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		if slow.Load() {
			time.Sleep(200 * time.Microsecond)
		}
		running.Add(-1)
		rpc.Respond(&raft.AppendEntriesResponse{Term: rpc.Command.(*raft.AppendEntriesRequest).Term, Success: true}, nil)
	})
	hb, err := encode(&raft.AppendEntriesRequest{RPCHeader: raft.RPCHeader{Addr: []byte(a.addr)}, Term: 7})
	if err != nil {
		t.Fatal(err)
	}
	batch := func(n int) *transportpb.HeartbeatBatch {
		in := &transportpb.HeartbeatBatch{}
		for range n {
			in.Rpcs = append(in.Rpcs, &transportpb.RPC{Group: "g", Msgpack: hb})
		}
		return in
	}
	cc, err := grpc.NewClient(b.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	client := transportpb.NewRaftTransportClient(cc)
	ctx := context.Background()
	out, err := client.Heartbeats(ctx, batch(MaxHeartbeatBatch))
	if err != nil || len(out.Rpcs) != MaxHeartbeatBatch {
		t.Fatalf("a batch of %d at the limit: %v", MaxHeartbeatBatch, err)
	}
	for i, r := range out.Rpcs {
		if r.Error != "" {
			t.Fatalf("heartbeat %d: %s", i, r.Error)
		}
	}
	if m := most.Load(); m > HeartbeatWorkers {
		t.Fatalf("%d heartbeats of one batch were served at once; at most %d may be", m, HeartbeatWorkers)
	}
	_, err = client.Heartbeats(ctx, batch(MaxHeartbeatBatch+1))
	if st, _ := status.FromError(err); st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), "the limit is 1024 per message") {
		t.Fatalf("a batch of %d: got %v, want ResourceExhausted naming the limit", MaxHeartbeatBatch+1, err)
	}

	// Queue more than a batch behind one in flight: they go in several.
	slow.Store(false)
	send, err := a.mux.Transport("g")
	if err != nil {
		t.Fatal(err)
	}
	before := a.mux.Stats().HeartbeatBatches.Load()
	const calls = MaxHeartbeatBatch + 500
	var wg sync.WaitGroup
	var failed atomic.Int64
	var firstErr atomic.Value
	for range calls {
		wg.Go(func() {
			var resp raft.AppendEntriesResponse
			if err := send.AppendEntries("", raft.ServerAddress(b.addr), &raft.AppendEntriesRequest{RPCHeader: raft.RPCHeader{Addr: []byte(a.addr)}, Term: 7}, &resp); err != nil || !resp.Success {
				failed.Add(1)
				firstErr.CompareAndSwap(nil, fmt.Sprint(err, resp.Success))
			}
		})
	}
	wg.Wait()
	if f := failed.Load(); f > 0 {
		t.Fatalf("%d of %d heartbeats failed, one with %v", f, calls, firstErr.Load())
	}
	if sent := a.mux.Stats().HeartbeatBatches.Load() - before; sent < 2 {
		t.Fatalf("%d heartbeats went in %d message(s); more than %d need at least 2", calls, sent, MaxHeartbeatBatch)
	}
}

// TestServeBounded: every element is served once, by at most workers
// goroutines at a time.
func TestServeBounded(t *testing.T) {
	for _, tc := range []struct{ n, workers int }{{0, 4}, {1, 4}, {3, 4}, {100, 4}, {100, 1}} {
		var running, most atomic.Int64
		seen := make([]atomic.Int32, tc.n)
		ServeBounded(tc.n, tc.workers, func(i int) {
			r := running.Add(1)
			for m := most.Load(); r > m && !most.CompareAndSwap(m, r); m = most.Load() {
			}
			seen[i].Add(1)
			time.Sleep(100 * time.Microsecond)
			running.Add(-1)
		})
		for i := range seen {
			if s := seen[i].Load(); s != 1 {
				t.Fatalf("n=%d workers=%d: element %d served %d times", tc.n, tc.workers, i, s)
			}
		}
		if m := most.Load(); m > int64(tc.workers) {
			t.Fatalf("n=%d workers=%d: %d ran at once", tc.n, tc.workers, m)
		}
	}
}
