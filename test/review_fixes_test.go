package test

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/raftps/raftps/replication"
	"github.com/raftps/raftps/shard/api"
	"github.com/raftps/raftps/shard/client"
	"github.com/raftps/raftps/shard/shardpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// metaFollower returns the index of a node that is not the metadata leader.
func metaFollower(t *testing.T, c *Cluster) int {
	t.Helper()
	for i := range c.Addrs() {
		if n := c.Node(i); n != nil && n.MetaRaft().State().String() == "Follower" {
			return i
		}
	}
	t.Fatal("no metadata follower")
	return -1
}

// TestReviewMessageLimits: with MaxMessageBytes far below a Raft message, a
// client request above MaxMessageBytes is refused with ResourceExhausted
// (ErrRequestTooLarge, naming size and limit), yet the nodes still accept
// AppendEntries larger than MaxMessageBytes: a follower that fell behind by
// several entries is caught up and ends bit-identical to the others.
func TestReviewMessageLimits(t *testing.T) {
	waitsMostly(t)
	const limit = 1 << 20
	c := StartCluster(t, 3, FastRaft())
	for i := range c.cfgs {
		c.Kill(i)
		c.cfgs[i].MaxMessageBytes = limit
	}
	for i := range c.cfgs {
		c.Start(i)
	}
	c.WaitMetaLeader(10 * time.Second)
	cl := c.Client()
	ctx := context.Background()
	const dim = 64
	if _, err := cl.Tables().Create(ctx, client.TableSpec{Name: "big", Dim: dim, Shards: 1, Optimizer: "sgd:lr=1"}); err != nil {
		t.Fatal(err)
	}
	push := func(n int, base uint64) error {
		keys := make([]uint64, n)
		grads := make([]float32, n*dim)
		for i := range keys {
			keys[i] = base + uint64(i)
		}
		for i := range grads {
			grads[i] = 1
		}
		return cl.Push(ctx, "big", keys, grads)
	}

	// ~1.3 MB push: over the limit.
	err := push(5000, 0)
	var re *client.RemoteError
	if !errors.Is(err, client.ErrRequestTooLarge) || !errors.As(err, &re) || re.Code != codes.ResourceExhausted ||
		!strings.Contains(err.Error(), "larger than max message size 1048576") {
		t.Fatalf("oversized push: got %v, want ResourceExhausted ErrRequestTooLarge naming the limit", err)
	}

	// A follower misses four ~530 KB entries, then must receive them in
	// AppendEntries of more than 1 MiB.
	f := (c.Leader("big", 0, 5*time.Second) + 1) % 3
	c.Kill(f)
	for i := range 4 {
		if err := push(2000, uint64(i)*2000); err != nil {
			t.Fatalf("push %d: %v", i, err)
		}
	}
	c.Start(f)
	sums := c.WaitConverged("big", 0, 20*time.Second)
	for i, s := range sums {
		if s != sums[0] {
			t.Fatalf("replica %d checksum %x, replica 0 %x", i, s, sums[0])
		}
	}
}

// TestReviewBoundedAndBadRequest: a bounded table with a bound below the
// minimum cannot be created, and a bounded pull of an eventual table that
// names no bound is refused rather than served as eventual. The refusal is a shard-level bad request, which the client maps
// back to client.ErrBadRequest and not to replication.ErrBadRequest (their
// texts used to be equal, so it came back as the replication one).
func TestReviewBoundedAndBadRequest(t *testing.T) {
	waitsMostly(t)
	c := StartCluster(t, 3, FastRaft())
	cl := c.Client()
	ctx := context.Background()
	spec := counterSpec("ev", 2)
	spec.Consistency = client.Consistency{Level: client.Bounded, Bound: time.Millisecond} // below the 10ms minimum
	if _, err := cl.Tables().Create(ctx, spec); !errors.Is(err, client.ErrInvalidConfig) {
		t.Fatalf("creating a bounded:1ms table: got %v, want ErrInvalidConfig", err)
	}
	spec = counterSpec("ev", 2)
	spec.Consistency = client.Consistency{Level: client.Eventual}
	if _, err := cl.Tables().Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	out := make([]float32, 2)
	// A bounded pull of an eventual table must say its bound.
	err := cl.Pull(ctx, "ev", []uint64{1}, out, client.WithConsistency(client.Bounded))
	var re *client.RemoteError
	if !errors.Is(err, client.ErrBadRequest) || errors.Is(err, replication.ErrBadRequest) ||
		!errors.As(err, &re) || re.Code != codes.InvalidArgument || !strings.Contains(err.Error(), "staleness_bound_ns") {
		t.Fatalf("bounded pull without a bound: got %v, want InvalidArgument client.ErrBadRequest only", err)
	}
	if err := cl.Pull(ctx, "ev", []uint64{1}, out, client.WithConsistency(client.Bounded), client.WithStaleness(50*time.Millisecond)); err != nil {
		t.Fatalf("bounded:50ms pull of an eventual table: %v", err)
	}
	// Stronger than the table's level still works.
	if err := cl.Pull(ctx, "ev", []uint64{1}, out, client.WithConsistency(client.Linearizable)); err != nil {
		t.Fatal(err)
	}
}

// TestReviewClientIDReused: a second Client with the same ClientID has its
// first push answered "duplicate" (its seq 1 is the first Client's); Push
// must return ErrClientIDReused instead of success, the row must hold only
// the first Client's push, and a Client with its own ID is unaffected.
func TestReviewClientIDReused(t *testing.T) {
	waitsMostly(t)
	c := StartCluster(t, 3, FastRaft())
	ctx := context.Background()
	a := c.ClientWith(func(cfg *client.Config) { cfg.ClientID = 42 })
	if _, err := a.Tables().Create(ctx, counterSpec("ids", 2)); err != nil {
		t.Fatal(err)
	}
	if err := a.Push(ctx, "ids", []uint64{7}, []float32{1, 1}); err != nil {
		t.Fatal(err)
	}
	b := c.ClientWith(func(cfg *client.Config) { cfg.ClientID = 42 })
	if err := b.Push(ctx, "ids", []uint64{7}, []float32{2, 2}); !errors.Is(err, client.ErrClientIDReused) {
		t.Fatalf("push by a second client with the same ID: got %v, want ErrClientIDReused", err)
	}
	other := c.Client()
	if err := other.Push(ctx, "ids", []uint64{7}, []float32{4, 4}); err != nil {
		t.Fatal(err)
	}
	out := make([]float32, 2)
	if err := other.Pull(ctx, "ids", []uint64{7}, out); err != nil {
		t.Fatal(err)
	}
	if out[0] != -5 || out[1] != -5 {
		t.Fatalf("row = %v, want [-5 -5] (pushes 1 and 4 applied, the refused 2 not)", out)
	}
}

// TestReviewSilentNode: a node that accepts connections but never answers
// costs each call one AttemptTimeout, not minutes: with it first in Addrs and
// a Background context, Tables().Create, Push and Pull all succeed quickly
// through the other nodes.
func TestReviewSilentNode(t *testing.T) {
	waitsMostly(t)
	c := StartCluster(t, 3, FastRaft())
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, conn) // held open, never read or written
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		for _, conn := range conns {
			conn.Close()
		}
		mu.Unlock()
	})
	cl := c.ClientWith(func(cfg *client.Config) {
		cfg.Addrs = append([]string{l.Addr().String()}, c.Addrs()...)
		cfg.AttemptTimeout = 300 * time.Millisecond
	})
	ctx := context.Background()
	start := time.Now()
	if _, err := cl.Tables().Create(ctx, counterSpec("quiet", 2)); err != nil {
		t.Fatal(err)
	}
	if err := cl.Push(ctx, "quiet", []uint64{1, 2, 3}, []float32{1, 1, 1, 1, 1, 1}); err != nil {
		t.Fatal(err)
	}
	out := make([]float32, 6)
	if err := cl.Pull(ctx, "quiet", []uint64{1, 2, 3}, out); err != nil {
		t.Fatal(err)
	}
	// gRPC's own connect timeout is 20s; without the attempt timeout the
	// first call alone would take that long.
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("three calls took %s with one silent node", d)
	}
}

// TestReviewUnknownTable: "unknown table" comes only on the metadata leader's
// word, and a node that is not the leader still gives it (by asking, or by
// redirecting the client). A data request for a missing table answers
// NotFound on every node; a client that knows only a metadata follower gets
// ErrUnknownTable from Describe, and sees a just-created table at once in
// Describe and List.
func TestReviewUnknownTable(t *testing.T) {
	waitsMostly(t)
	c := StartCluster(t, 3, FastRaft())
	ctx := context.Background()
	k := api.KeysBytes([]uint64{1})
	for i, addr := range c.Addrs() {
		// A node that does not know the metadata leader yet (just started)
		// answers Unavailable, which is retryable; once it does, NotFound.
		var err error
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			_, err = c.RawStub(addr).Push(ctx, &shardpb.PushRequest{Table: "nope", ClientId: 1, Seq: 1, Keys: k, Grads: api.ValuesBytes([]float32{1})})
			if status.Code(err) != codes.Unavailable || time.Now().After(deadline) {
				break
			}
		}
		if status.Code(err) != codes.NotFound || !strings.Contains(err.Error(), `"nope"`) {
			t.Errorf("node %d: push to a missing table: got %v, want NotFound", i, err)
		}
	}
	f := c.ClientWith(func(cfg *client.Config) { cfg.Addrs = []string{c.Addrs()[metaFollower(t, c)]} })
	if _, err := f.Tables().Describe(ctx, "nope"); !errors.Is(err, client.ErrUnknownTable) {
		t.Fatalf("describe through a metadata follower: got %v, want ErrUnknownTable", err)
	}
	if _, err := c.Client().Tables().Create(ctx, counterSpec("fresh", 2)); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Tables().Describe(ctx, "fresh"); err != nil {
		t.Fatalf("describe of a just-created table through a metadata follower: %v", err)
	}
	tables, err := f.Tables().List(ctx)
	if err != nil || len(tables) != 1 || tables[0].Name != "fresh" {
		t.Fatalf("list through a metadata follower: %v %v", tables, err)
	}
}
