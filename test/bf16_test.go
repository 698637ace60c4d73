package test

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/raftps/raftps/shard"
	"github.com/raftps/raftps/shard/api"
	"github.com/raftps/raftps/shard/client"
	"github.com/raftps/raftps/shard/shardpb"
	"github.com/raftps/raftps/store"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestClusterBF16Table: a table of bfloat16 gradients, Raft and chain.
// Each gradient is rounded once, after the client sums a key's duplicates
// (or, for a float32 push from another client, by the node that takes
// it), so the rows are exactly what float32 SGD of the rounded gradients
// gives, on every replica; bad bfloat16 input is refused and changes
// nothing.
func TestClusterBF16Table(t *testing.T) {
	waitsMostly(t)
	c := StartCluster(t, 3, FastRaft())
	cl := c.Client()
	ctx := context.Background()
	const dim = 3
	for _, repl := range []client.Replication{client.Raft, client.Chain} {
		name := "half_" + string(repl)
		spec := counterSpec(name, dim)
		spec.Replication, spec.GradPrecision = repl, client.GradBF16
		got, err := cl.Tables().Create(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		if got.GradPrecision != client.GradBF16 {
			t.Fatalf("%s: created with grad precision %q", name, got.GradPrecision)
		}
		// Key 1 twice: the client sums 0.1 and 0.2 in float32, then rounds.
		keys := []uint64{1, 2, 3, 1}
		grads := []float32{
			0.1, 1.0 / 3, -7e-3,
			1, 2, 3,
			-1e5 / 3, 0.999, 12345.678,
			0.2, 0.2, 0.2,
		}
		want := map[uint64][]float32{}
		for _, k := range []uint64{1, 2, 3} {
			want[k] = make([]float32, dim)
		}
		sum := map[uint64][]float32{}
		for i, k := range keys {
			if sum[k] == nil {
				sum[k] = make([]float32, dim)
			}
			for col := range dim {
				sum[k][col] += grads[i*dim+col]
			}
		}
		for k, g := range sum {
			for col := range dim {
				want[k][col] -= store.RoundBF16(g[col])
			}
		}
		if err := cl.Push(ctx, name, keys, grads); err != nil {
			t.Fatal(err)
		}
		// A gradient past bfloat16's largest finite value rounds to +Inf:
		// refused, nothing applied.
		err = cl.Push(ctx, name, []uint64{2}, []float32{1, 3.3999e38, 1})
		if err == nil || !strings.Contains(err.Error(), "Inf") {
			t.Fatalf("%s: push that rounds to +Inf: %v", name, err)
		}
		check := func(when string) {
			t.Helper()
			ks := []uint64{1, 2, 3}
			out := make([]float32, len(ks)*dim)
			if err := cl.Pull(ctx, name, ks, out); err != nil {
				t.Fatal(err)
			}
			for i, k := range ks {
				for col := range dim {
					if g, w := out[i*dim+col], want[k][col]; math.Float32bits(g) != math.Float32bits(w) {
						t.Fatalf("%s %s: key %d column %d = %v, want %v (float32 SGD of the rounded gradient)", name, when, k, col, g, w)
					}
				}
			}
		}
		check("after client pushes")
		if repl == client.Chain {
			continue
		}
		// A float32 push from a client that does not round (the Python
		// client, an older Go client) is rounded by the node.
		shard := api.ShardOf(2, shards)
		lead := c.RawStub(c.Addrs()[c.Leader(name, shard, 5*time.Second)])
		raw := []float32{0.3, -0.7, 1e-4}
		if _, err := lead.Push(ctx, &shardpb.PushRequest{Table: name, Shard: shard, ClientId: 77, Seq: 1, Keys: api.KeysBytes([]uint64{2}), Grads: api.ValuesBytes(raw)}); err != nil {
			t.Fatal(err)
		}
		for col := range dim {
			want[2][col] -= store.RoundBF16(raw[col])
		}
		check("after a float32 push")
		bad := []struct {
			name string
			req  *shardpb.PushRequest
			msg  string
		}{
			{"odd bytes", &shardpb.PushRequest{Table: name, Shard: shard, ClientId: 77, Seq: 2, Keys: api.KeysBytes([]uint64{2}), Grads: make([]byte, 5), GradsBf16: true}, "multiple of 2"},
			{"wrong dim", &shardpb.PushRequest{Table: name, Shard: shard, ClientId: 77, Seq: 3, Keys: api.KeysBytes([]uint64{2}), Grads: make([]byte, 4), GradsBf16: true}, "dim"},
			{"float32 past bfloat16's range", &shardpb.PushRequest{Table: name, Shard: shard, ClientId: 77, Seq: 5, Keys: api.KeysBytes([]uint64{2}), Grads: api.ValuesBytes([]float32{1, 3.3999e38, 1})}, "Inf"},
			{"NaN", &shardpb.PushRequest{Table: name, Shard: shard, ClientId: 77, Seq: 4, Keys: api.KeysBytes([]uint64{2}), Grads: []byte{0, 0, 0xc0, 0x7f, 0, 0}, GradsBf16: true}, "NaN"},
		}
		for _, b := range bad {
			_, err := lead.Push(ctx, b.req)
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), b.msg) {
				t.Errorf("%s: %s: %v, want InvalidArgument naming %q", name, b.name, err, b.msg)
			}
		}
		check("after refused pushes")
		for s := range uint32(shards) {
			sums := c.WaitConverged(name, s, 10*time.Second)
			for i := range sums {
				if sums[i] != sums[0] {
					t.Fatalf("%s shard %d: replica checksums %x differ", name, s, sums)
				}
			}
		}
	}
	// bfloat16 gradients for a float32 table are refused, not widened
	// silently: the client and the table disagree about the table.
	if _, err := cl.Tables().Create(ctx, counterSpec("full", dim)); err != nil {
		t.Fatal(err)
	}
	shard := api.ShardOf(2, shards)
	lead := c.RawStub(c.Addrs()[c.Leader("full", shard, 5*time.Second)])
	_, err := lead.Push(ctx, &shardpb.PushRequest{Table: "full", Shard: shard, ClientId: 78, Seq: 1, Keys: api.KeysBytes([]uint64{2}), Grads: make([]byte, 6), GradsBf16: true})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "bfloat16") {
		t.Fatalf("bf16 push to a float32 table: %v", err)
	}
	// An unknown precision is refused at creation.
	bad := counterSpec("bad", dim)
	bad.GradPrecision = "fp8"
	if _, err := cl.Tables().Create(ctx, bad); !errors.Is(err, client.ErrInvalidConfig) || !strings.Contains(err.Error(), "fp8") {
		t.Fatalf("grad precision fp8: %v", err)
	}
}

// TestClusterBF16NeedsEveryNode: with one node of a build that knows no
// bfloat16 gradients (it gossips no features), a bf16 table is refused
// with an error naming that node, and nothing is created; float32 tables
// are created as ever.
func TestClusterBF16NeedsEveryNode(t *testing.T) {
	waitsMostly(t)
	c := StartClusterWith(t, 3, FastRaft(), func(cfg *shard.NodeConfig) {
		if cfg.ID == "n3" {
			none := uint32(0)
			cfg.GossipFeatures = &none
		}
	})
	cl := c.Client()
	ctx := context.Background()
	spec := counterSpec("half", 2)
	spec.GradPrecision = client.GradBF16
	_, err := cl.Tables().Create(ctx, spec)
	if !errors.Is(err, client.ErrInvalidConfig) || !strings.Contains(err.Error(), "node n3") {
		t.Fatalf("bf16 table with n3 on an older build: %v, want ErrInvalidConfig naming n3", err)
	}
	if _, err := cl.Tables().Describe(ctx, "half"); !errors.Is(err, client.ErrUnknownTable) {
		t.Fatalf("the refused table exists: %v", err)
	}
	if _, err := cl.Tables().Create(ctx, counterSpec("full", 2)); err != nil {
		t.Fatalf("fp32 table beside an older node: %v", err)
	}
}
