package test

import (
	"context"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/raftps/raftps/shard/api"
	"github.com/raftps/raftps/shard/shardpb"
	"google.golang.org/grpc/codes"
)

// TestBatchPartsFailAlone: a PullBatch or PushBatch part that this node cannot
// serve fails on its own, with the code and leader hint the single call would
// give, and the other parts are served. Afterwards only the good parts were
// applied.
func TestBatchPartsFailAlone(t *testing.T) {
	waitsMostly(t)
	c := StartCluster(t, 3, FastRaft())
	ctx := context.Background()
	if _, err := c.Client().Tables().Create(ctx, counterSpec("emb", 1)); err != nil {
		t.Fatal(err)
	}
	// A node leading shard s but not shard o. Create returns once the node
	// that created the table serves it; the others may still be opening
	// their replicas (a nil Group).
	for sh := range uint32(shards) {
		c.Leader("emb", sh, 10*time.Second)
	}
	var node, s, o int = -1, -1, -1
	for i := range 3 {
		for sh := range uint32(shards) {
			if g := c.Node(i).Group("emb", sh); g != nil && g.IsLeader() {
				s = int(sh)
			} else {
				o = int(sh)
			}
		}
		if s >= 0 && o >= 0 {
			node = i
			break
		}
		s, o = -1, -1
	}
	if node < 0 {
		t.Skip("one node leads every shard")
	}
	keyOf := func(sh int) []byte {
		for k := uint64(0); ; k++ {
			if api.ShardOf(k, shards) == uint32(sh) {
				return api.KeysBytes([]uint64{k})
			}
		}
	}
	stub := c.RawStub(c.Addrs()[node])
	push, err := stub.PushBatch(ctx, &shardpb.PushBatchRequest{Parts: []*shardpb.PushRequest{
		{Table: "emb", Shard: uint32(s), ClientId: 7, Seq: 1, Keys: keyOf(s), Grads: api.ValuesBytes([]float32{-2})},
		{Table: "emb", Shard: uint32(o), ClientId: 7, Seq: 1, Keys: keyOf(o), Grads: api.ValuesBytes([]float32{-2})},
		{Table: "nope", Shard: 0, ClientId: 7, Seq: 1, Keys: keyOf(0), Grads: api.ValuesBytes([]float32{-2})},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if len(push.Parts) != 3 || len(push.Errors) != 3 {
		t.Fatalf("push batch answered %d parts, %d errors for 3", len(push.Parts), len(push.Errors))
	}
	if push.Errors[0].Code != 0 {
		t.Fatalf("part on the leader failed: %v", push.Errors[0])
	}
	if e := push.Errors[1]; codes.Code(e.Code) != codes.FailedPrecondition || e.GetInfo().GetLeaderAddr() == "" || e.GetInfo().GetLeaderAddr() == c.Addrs()[node] {
		t.Fatalf("part on a follower: got %v, want FailedPrecondition naming another leader", e)
	}
	if e := push.Errors[2]; codes.Code(e.Code) != codes.NotFound {
		t.Fatalf("part of an unknown table: got %v, want NotFound", e)
	}
	pull, err := stub.PullBatch(ctx, &shardpb.PullBatchRequest{Parts: []*shardpb.PullRequest{
		{Table: "emb", Shard: uint32(s), Keys: keyOf(s)},
		{Table: "emb", Shard: uint32(o), Keys: keyOf(o)},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if pull.Errors[0].Code != 0 || len(pull.Parts[0].Values) != 4 {
		t.Fatalf("pull part on the leader: %v, %d bytes", pull.Errors[0], len(pull.Parts[0].Values))
	}
	if got, err := api.DecodeValues(pull.Parts[0].Values, nil); err != nil || got[0] != 2 {
		t.Fatalf("row of shard %d is %v (%v), want the one push applied (2)", s, got, err)
	}
	if codes.Code(pull.Errors[1].Code) != codes.FailedPrecondition {
		t.Fatalf("pull part on a follower: got %v, want FailedPrecondition", pull.Errors[1])
	}
	// The refused part was not applied: its row is still zero.
	out := make([]float32, 1)
	k := make([]uint64, 1)
	if _, err := api.DecodeKeys(keyOf(o), k); err != nil {
		t.Fatal(err)
	}
	if err := c.Client().Pull(ctx, "emb", k, out); err != nil || out[0] != 0 {
		t.Fatalf("refused part changed row %d: %v %v", k[0], out, err)
	}
}

// TestClientFollowsMovedLeaders: after every shard's leadership moves, a
// client whose leader cache is stale still pushes and pulls (its batches meet
// NotLeader parts and fall back to the per-shard path), and every push is
// applied exactly once.
func TestClientFollowsMovedLeaders(t *testing.T) {
	waitsMostly(t)
	c := StartCluster(t, 3, FastRaft())
	ctx := context.Background()
	cl := c.Client()
	spec := counterSpec("emb", 2)
	if _, err := cl.Tables().Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	keys := []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}
	grads := make([]float32, len(keys)*2)
	for i := range grads {
		grads[i] = -1
	}
	if err := cl.Push(ctx, "emb", keys, grads); err != nil { // fills the leader cache
		t.Fatal(err)
	}
	for sh := range uint32(shards) {
		l := c.Leader("emb", sh, 5*time.Second)
		if err := c.Node(l).Group("emb", sh).Raft().LeadershipTransfer().Error(); err != nil && err != raft.ErrNotLeader {
			t.Fatalf("moving leadership of shard %d: %v", sh, err)
		}
	}
	for sh := range uint32(shards) {
		c.Leader("emb", sh, 5*time.Second)
	}
	if err := cl.Push(ctx, "emb", keys, grads); err != nil {
		t.Fatal(err)
	}
	out := make([]float32, len(keys)*2)
	if err := cl.Pull(ctx, "emb", keys, out); err != nil {
		t.Fatal(err)
	}
	for i, v := range out {
		if v != 2 {
			t.Fatalf("value %d of key %d is %v after two pushes of -1 (lr 1): want 2", i%2, keys[i/2], v)
		}
	}
}
