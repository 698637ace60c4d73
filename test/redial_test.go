package test

import (
	"context"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/raftps/raftps/replication"
	"github.com/raftps/raftps/shard/api"
	"github.com/raftps/raftps/shard/shardpb"
)

// TestClientRedialsARestartedNode: a node that was down for ten seconds
// comes back and takes a shard's leadership; the client's next push to
// that shard must reach it at once. With gRPC's default reconnect backoff
// (1 s, growing by 1.6 to 2 minutes) the client's connection to the node
// was not redialled for seconds after the node was back, and every push
// to the shard failed fast against it meanwhile: the 2.2 s pushes of a
// local chaos run, after a killed leader came back and was handed its
// shards again.
func TestClientRedialsARestartedNode(t *testing.T) {
	waitsMostly(t)
	c := StartCluster(t, 3, FastRaft())
	spec, err := c.Client().Tables().Create(context.Background(), counterSpec("redial", 2))
	if err != nil {
		t.Fatal(err)
	}
	l := newLedger(t, spec)
	cl := c.Client()
	key := uint64(0)
	for api.ShardOf(key, shards) != 0 {
		key++
	}
	push := func() time.Duration {
		t.Helper()
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := cl.Push(ctx, "redial", []uint64{key}, []float32{1, 1}); err != nil {
			t.Fatalf("push to shard 0: %v", err)
		}
		l.record(t, []uint64{key}, []float32{1, 1})
		return time.Since(start)
	}
	push()
	victim := c.Leader("redial", 0, 5*time.Second)
	c.Kill(victim)
	push() // to the new leader
	// Calls the client makes to the dead node meanwhile (spread reads,
	// status) fail and keep its connection redialling, with backoff.
	raw, err := cl.Raw(c.Addrs()[victim])
	if err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		if _, err := raw.Status(ctx, &shardpb.StatusRequest{}); err == nil {
			t.Fatal("the killed node answered")
		}
		cancel()
	}
	c.Start(victim)
	c.waitFor(10*time.Second, "the restarted node's replica of shard 0", func() bool { return c.Node(victim).Group("redial", 0) != nil })
	c.WaitConverged("redial", 0, 10*time.Second)
	for try := 0; c.Leader("redial", 0, 5*time.Second) != victim; try++ {
		if try == 5 {
			t.Fatalf("n%d does not take shard 0's leadership", victim+1)
		}
		g := c.Node(c.Leader("redial", 0, 5*time.Second)).Group("redial", 0)
		if err := replication.Await(g.Raft(), g.TransferLeadership(raft.ServerID(c.ID(victim)), raft.ServerAddress(c.PeerAddr(victim)))); err != nil {
			t.Logf("handing shard 0 back to n%d: %v", victim+1, err)
		}
	}
	took := push()
	t.Logf("n%d back and leading shard 0; the next push took %s", victim+1, took.Round(time.Millisecond))
	if took > 1500*time.Millisecond {
		t.Errorf("a push to a restarted node's shard took %s: the client did not redial the node", took)
	}
	verify(t, c, l, "redial")
}
