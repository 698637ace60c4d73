package test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/raftps/raftps/shard"
	"github.com/raftps/raftps/shard/api"
	"github.com/raftps/raftps/shard/client"
	"github.com/raftps/raftps/shard/membership"
	"github.com/raftps/raftps/shard/shardpb"
	"github.com/raftps/raftps/test/history"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// chainSpec is a linearizable chain table of 2 shards of dim 2 whose rows
// are exact sums of the pushed gradients.
func chainSpec(name string) client.TableSpec {
	spec := levelSpec(name, client.Linearizable, 0)
	spec.Dim, spec.Replication = 2, client.Chain
	return spec
}

// waitChain waits until table/s's map entry satisfies cond, and returns it.
func (c *Cluster) waitChain(table string, s uint32, timeout time.Duration, what string, cond func(sm *shardpb.ShardMap) bool) *shardpb.ShardMap {
	c.t.Helper()
	var got *shardpb.ShardMap
	c.waitFor(timeout, fmt.Sprintf("%s/%d: %s", table, s, what), func() bool {
		got = c.ShardMap(table, s)
		return got != nil && cond(got)
	})
	return got
}

// oneChainPushed creates chain table table with one shard, pushes (1, 0) to
// key 7 and waits until the chain has three members; it returns a client
// and the shard's map entry.
func (c *Cluster) oneChainPushed(table string) (*client.Client, *shardpb.ShardMap) {
	c.t.Helper()
	cl := c.Client()
	ctx := context.Background()
	spec := chainSpec(table)
	spec.Shards = 1
	if _, err := cl.Tables().Create(ctx, spec); err != nil {
		c.t.Fatal(err)
	}
	if err := cl.Push(ctx, table, []uint64{7}, []float32{1, 0}); err != nil {
		c.t.Fatal(err)
	}
	return cl, c.waitChain(table, 0, 10*time.Second, "three members", func(sm *shardpb.ShardMap) bool { return len(sm.Replicas) == 3 })
}

// middleReplica returns the middle member of sm's chain, its index and its
// replica's directory.
func (c *Cluster) middleReplica(sm *shardpb.ShardMap) (id string, i int, dir string) {
	id = sm.Replicas[1]
	i = c.Index(id)
	return id, i, filepath.Join(c.cfgs[i].DataDir, "chains", sm.Table, fmt.Sprint(sm.Shard))
}

// metaLeader returns the index of the node that leads the metadata group.
func (c *Cluster) metaLeader() int {
	c.t.Helper()
	for i := range c.Len() {
		if n := c.Node(i); n != nil && n.MetaRaft().State() == raft.Leader {
			return i
		}
	}
	c.t.Fatal("no metadata leader")
	return -1
}

// cutOff blackholes node i's traffic (peer gRPC and gossip) to and from
// every other node of the cluster; clients still reach it. The nodes need
// FaultInjection.
func (c *Cluster) cutOff(i int) {
	c.t.Helper()
	addrsOf := func(i int) []string { return []string{c.cfgs[i].PeerAddr, c.cfgs[i].Gossip.Addr} }
	var others []string
	for j := range c.Len() {
		if j != i {
			others = append(others, addrsOf(j)...)
			if err := c.Node(j).BlockPeers(addrsOf(i)...); err != nil {
				c.t.Fatal(err)
			}
		}
	}
	if err := c.Node(i).BlockPeers(others...); err != nil {
		c.t.Fatal(err)
	}
}

// heal undoes every node's cutOff.
func (c *Cluster) heal() {
	c.t.Helper()
	for i := range c.Len() {
		if n := c.Node(i); n != nil {
			if err := n.BlockPeers(); err != nil {
				c.t.Error(err)
			}
		}
	}
}

// pushSecond pushes (1, 0) to key 7 of oneChainPushed's table again and
// checks that the row holds both pushes.
func (c *Cluster) pushSecond(cl *client.Client, table string) {
	c.t.Helper()
	ctx := context.Background()
	if err := cl.Push(ctx, table, []uint64{7}, []float32{1, 0}); err != nil {
		c.t.Fatal(err)
	}
	out := make([]float32, 2)
	if err := cl.Pull(ctx, table, []uint64{7}, out); err != nil || out[0] != -2 {
		c.t.Errorf("row after two acknowledged pushes: %v, %v; want -2", out, err)
	}
}

// TestChainHistoryThroughKills runs pushes and linearizable pulls from
// several clients against a chain table while the head, then the tail, then
// a middle member of shard 0 is killed (each restarted after the meta group
// has removed it, and appended again at the tail), then checks: no
// acknowledged push lost or applied twice, the history linearizable
// (porcupine), the replicas' checksums equal; and that every reconfiguration
// kept the survivors' order and appended at the tail.
func TestChainHistoryThroughKills(t *testing.T) {
	if raceDetector {
		// make test's budget: the chain's concurrency is race-tested in
		// replication/chain (chain_test.go); this runs in make test-unit.
		t.Skip("in-process cluster with kills; run without -race")
	}
	c := StartCluster(t, 3, FastRaft())
	cl := c.Client()
	ctx := context.Background()
	const table = "chist"
	spec, err := cl.Tables().Create(ctx, chainSpec(table))
	if err != nil {
		t.Fatal(err)
	}
	if spec.Replication != client.Chain {
		t.Fatalf("created spec has replication %q", spec.Replication)
	}
	rec := history.NewRecorder()
	stop := make(chan struct{})
	wg := historyWorkload(c, rec, table, "linearizable", 3, 24, stop)

	for _, role := range []string{"head", "tail", "middle"} {
		time.Sleep(700 * time.Millisecond)
		sm := c.waitChain(table, 0, 20*time.Second, "three members", func(sm *shardpb.ShardMap) bool { return len(sm.Replicas) == 3 })
		victim := map[string]string{"head": sm.Replicas[0], "middle": sm.Replicas[1], "tail": sm.Replicas[2]}[role]
		t.Logf("killing the %s %s of %v (epoch %d)", role, victim, sm.Replicas, sm.Epoch)
		i := c.Index(victim)
		c.Kill(i)
		rest := slices.DeleteFunc(slices.Clone(sm.Replicas), func(id string) bool { return id == victim })
		removed := c.waitChain(table, 0, 20*time.Second, victim+" removed", func(x *shardpb.ShardMap) bool { return !slices.Contains(x.Replicas, victim) })
		if !slices.Equal(removed.Replicas, rest) {
			t.Errorf("after removing %s: order %v, want %v (survivors in order)", victim, removed.Replicas, rest)
		}
		c.Start(i)
		back := c.waitChain(table, 0, 20*time.Second, victim+" appended again", func(x *shardpb.ShardMap) bool { return len(x.Replicas) == 3 })
		if !slices.Equal(back.Replicas[:2], rest) {
			t.Errorf("after re-adding: order %v, want %v then the new tail", back.Replicas, rest)
		}
	}
	time.Sleep(700 * time.Millisecond)
	close(stop)
	wg.Wait()

	ops := rec.Ops()
	dir := t.TempDir()
	path := filepath.Join(dir, table+".jsonl")
	if err := history.WriteFile(path, ops); err != nil {
		t.Fatal(err)
	}
	n := history.Count(ops)
	pushes, pulls, unknown := n.Pushes, n.Pulls, n.Unknown
	t.Logf("%d acknowledged pushes, %d pulls, %d unknown outcomes", pushes, pulls, unknown)
	if pushes < 50 || pulls < 50 {
		t.Errorf("only %d pushes and %d pulls completed", pushes, pulls)
	}
	for s := range uint32(2) {
		c.waitChain(table, s, 20*time.Second, "three members", func(sm *shardpb.ShardMap) bool { return len(sm.Replicas) == 3 })
		if sums := c.WaitConverged(table, s, 30*time.Second); len(sums) != 3 || !allEqual(sums) {
			t.Errorf("%s/%d: replica checksums %v, want 3 equal", table, s, sums)
		}
	}
	keys := make([]uint64, 24)
	for i := range keys {
		keys[i] = uint64(i)
	}
	out := make([]float32, 2*len(keys))
	if err := cl.Pull(ctx, table, keys, out); err != nil {
		t.Fatal(err)
	}
	final := map[uint64]int64{}
	for i, k := range keys {
		final[k] = int64(out[2*i])
	}
	if fr := history.CheckFinal(ops, final); !fr.OK() || fr.Lost != 0 || fr.Doubled != 0 {
		t.Errorf("%v (history in %s)", fr, path)
	}
	res, err := history.CheckLinearizable(ops, time.Minute, filepath.Join(dir, table+".html"))
	if err != nil {
		t.Fatal(err)
	}
	if !res.OK {
		t.Errorf("not linearizable: %v (history %s)", res, path)
	}
}

// TestChainStatus checks that a node's status shows each chain replica's
// role, epoch and order, that the head's state reads "leader" (as raftps
// chaos expects of a group's leader), and that the replicas' checksums,
// asked for, agree.
func TestChainStatus(t *testing.T) {
	waitsMostly(t)
	c := StartCluster(t, 3, FastRaft())
	cl := c.Client()
	ctx := context.Background()
	spec := chainSpec("cstat")
	spec.Shards = 1
	if _, err := cl.Tables().Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	keys, grads := []uint64{1, 2, 3}, []float32{1, 1, 2, 2, 3, 3}
	if err := cl.Push(ctx, "cstat", keys, grads); err != nil {
		t.Fatal(err)
	}
	sm := c.ShardMap("cstat", 0)
	c.WaitConverged("cstat", 0, 10*time.Second)
	roles := map[string]string{}
	var sums []uint64
	for _, addr := range c.Addrs() {
		st, err := cl.Admin().NodeStatus(ctx, addr, true)
		if err != nil {
			t.Fatal(err)
		}
		for _, rs := range st.Replicas {
			if rs.Group != "cstat/0" {
				continue
			}
			if rs.Replication != api.ReplicationChain || rs.ChainEpoch != sm.Epoch || !slices.Equal(rs.ChainOrder, sm.Replicas) {
				t.Errorf("%s: status %+v, want a chain replica at epoch %d with order %v", st.NodeID, rs, sm.Epoch, sm.Replicas)
			}
			if (rs.State == "leader") != (rs.ChainRole == "head") || rs.Leader != sm.Replicas[0] {
				t.Errorf("%s: state %q role %q leader %q; the head is %s", st.NodeID, rs.State, rs.ChainRole, rs.Leader, sm.Replicas[0])
			}
			roles[st.NodeID] = rs.ChainRole
			if rs.Checksum == nil {
				t.Errorf("%s: no checksum", st.NodeID)
			} else {
				sums = append(sums, *rs.Checksum)
			}
		}
	}
	want := map[string]string{sm.Replicas[0]: "head", sm.Replicas[1]: "middle", sm.Replicas[2]: "tail"}
	if fmt.Sprint(roles) != fmt.Sprint(want) {
		t.Errorf("roles %v, want %v", roles, want)
	}
	if len(sums) != 3 || !allEqual(sums) {
		t.Errorf("checksums %v, want 3 equal", sums)
	}
	// Every level reads the push: an acknowledged push is applied on every
	// member (each applies before it forwards), so even eventual reads,
	// served from a member's own state, see it.
	for _, o := range []struct {
		level string
		opts  []client.PullOption
	}{{"table's", nil},
		{"bounded:50ms", []client.PullOption{client.WithConsistency(client.Bounded), client.WithStaleness(50 * time.Millisecond), client.AllowWeaker()}},
		{"eventual", []client.PullOption{client.WithConsistency(client.Eventual), client.AllowWeaker()}}} {
		for range 3 { // spread pulls pick a member at random
			out := make([]float32, 6)
			if err := cl.Pull(ctx, "cstat", keys, out, o.opts...); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(out, []float32{-1, -1, -2, -2, -3, -3}) {
				t.Errorf("level %v: pulled %v after one sgd:lr=1 push of %v", o.level, out, grads)
			}
		}
	}
}

// TestChainCutOffMemberServesNoStaleRead cuts a chain member off from the
// rest of the cluster while clients still reach it, as a partition does,
// and checks:
//   - the metadata leader removes it from the chain on its own silence,
//     before gossip (slowed here to about 7 s) declares it dead;
//   - pushes go on without it;
//   - it then refuses linearizable and bounded reads rather than serve its
//     old row (it holds no lease: only the metadata leader's word that its
//     epoch is current lets it serve), while eventual reads still see it;
//   - healed, it is appended again and serves the new row.
func TestChainCutOffMemberServesNoStaleRead(t *testing.T) {
	waitsMostly(t)
	c := StartClusterWith(t, 3, FastRaft(), func(cfg *shard.NodeConfig) {
		cfg.FaultInjection = true
		cfg.Gossip.ProbeInterval, cfg.Gossip.ProbeTimeout, cfg.Gossip.SuspicionMult = time.Second, 500*time.Millisecond, 6
	})
	cl := c.Client()
	ctx := context.Background()
	const table = "ccut"
	spec := chainSpec(table)
	spec.Shards = 1
	if _, err := cl.Tables().Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if err := cl.Push(ctx, table, []uint64{5}, []float32{1, 0}); err != nil {
		t.Fatal(err)
	}
	c.WaitConverged(table, 0, 10*time.Second)

	meta := c.metaLeader()
	sm := c.waitChain(table, 0, 10*time.Second, "three members", func(sm *shardpb.ShardMap) bool { return len(sm.Replicas) == 3 })
	victimID := sm.Replicas[2] // the tail: it answers from its own state
	if c.Index(victimID) == meta {
		victimID = sm.Replicas[1]
	}
	victim := c.Index(victimID)
	c.cutOff(victim)
	cut := time.Now()
	t.Logf("cut off %s of chain %v (epoch %d); metadata leader %s", victimID, sm.Replicas, sm.Epoch, c.ID(meta))

	var removed *shardpb.ShardMap
	c.waitFor(20*time.Second, victimID+" removed from the chain", func() bool {
		for _, x := range c.Node(meta).ClusterMap().Shards {
			if x.Table == table && !slices.Contains(x.Replicas, victimID) {
				removed = x
				return true
			}
		}
		return false
	})
	gossip := "not listed"
	for _, m := range c.Node(meta).Members() {
		if m.ID == victimID {
			gossip = m.State
		}
	}
	t.Logf("removed after %s: order %v, epoch %d; gossip says %s", time.Since(cut).Round(time.Millisecond), removed.Replicas, removed.Epoch, gossip)
	if gossip == membership.Dead {
		t.Errorf("gossip had declared %s dead before the metadata leader removed it for its silence", victimID)
	}
	pctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := cl.Push(pctx, table, []uint64{5}, []float32{1, 0}); err != nil {
		t.Fatalf("push after %s was removed: %v", victimID, err)
	}

	conn, err := grpc.NewClient(c.cfgs[victim].Addr, c.DialOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	st := shardpb.NewParameterServerClient(conn)
	pull := func(level shardpb.Consistency) (float32, error) {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		return firstValue(st.Pull(rctx, &shardpb.PullRequest{Table: table, Keys: api.KeysBytes([]uint64{5}), Consistency: level, StalenessBoundNs: int64(100 * time.Millisecond), AllowWeaker: true}))
	}
	for _, level := range []shardpb.Consistency{shardpb.Consistency_CONSISTENCY_LINEARIZABLE, shardpb.Consistency_CONSISTENCY_BOUNDED} {
		v, err := pull(level)
		t.Logf("%s read at the cut-off %s: %v, %v", level, victimID, v, err)
		if err == nil {
			t.Errorf("%s read at the cut-off %s after its removal returned %v; the chain's row is -2", level, victimID, v)
		} else if status.Code(err) != codes.Unavailable {
			t.Errorf("%s read at the cut-off %s: %v, want Unavailable", level, victimID, err)
		}
	}
	if v, err := pull(shardpb.Consistency_CONSISTENCY_EVENTUAL); err != nil || v != -1 {
		t.Errorf("eventual read at the cut-off %s: %v, %v; want its own row -1", victimID, v, err)
	}

	c.heal()
	healed := time.Now()
	c.waitFor(30*time.Second, victimID+" appended again and serving the new row", func() bool {
		v, err := pull(shardpb.Consistency_CONSISTENCY_LINEARIZABLE)
		return err == nil && v == -2
	})
	t.Logf("healed: %s serves the new row after %s", victimID, time.Since(healed).Round(time.Millisecond))
	if sums := c.WaitConverged(table, 0, 30*time.Second); len(sums) != 3 || !allEqual(sums) {
		t.Errorf("replica checksums %v, want 3 equal", sums)
	}
}

// TestChainBrokenMemberRemoved fails the disk of a chain's middle member
// (its node stays up and gossips as alive): pushes stall at it, its node
// reports it to the metadata leader, which removes it from the chain and
// does not append the node again at once; pushes then go on, nothing
// acknowledged is lost, and the node has closed and deleted its replica.
func TestChainBrokenMemberRemoved(t *testing.T) {
	waitsMostly(t)
	c := StartCluster(t, 3, FastRaft())
	const table = "cbroken"
	cl, sm := c.oneChainPushed(table)
	ctx := context.Background()
	victimID := sm.Replicas[1]
	victim := c.Node(c.Index(victimID))
	ch := victim.Chain(table, 0)
	if ch == nil {
		t.Fatalf("%s has no replica of %s/0", victimID, table)
	}
	ch.Fail(errors.New("test: disk failed"))
	failed := time.Now()

	// A push in flight through the broken member is not acknowledged until
	// the chain is reconfigured without it; the client's retries then land.
	pctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := cl.Push(pctx, table, []uint64{7}, []float32{1, 0}); err != nil {
		t.Fatalf("push after %s's disk failed: %v", victimID, err)
	}
	after := c.waitChain(table, 0, 10*time.Second, victimID+" removed", func(x *shardpb.ShardMap) bool { return !slices.Contains(x.Replicas, victimID) })
	t.Logf("%s removed %s after its disk failed: order %v, epoch %d", victimID, time.Since(failed).Round(time.Millisecond), after.Replicas, after.Epoch)
	if want := []string{sm.Replicas[0], sm.Replicas[2]}; !slices.Equal(after.Replicas[:2], want) {
		t.Errorf("order after the removal %v, want %v first", after.Replicas, want)
	}
	c.waitFor(10*time.Second, victimID+" closes its broken replica", func() bool { return victim.Chain(table, 0) == nil })
	out := make([]float32, 2)
	if err := cl.Pull(ctx, table, []uint64{7}, out); err != nil || out[0] != -2 {
		t.Errorf("row after two acknowledged pushes: %v, %v; want -2", out, err)
	}
	// The node is not given the replica back at once: its disk may fail again.
	time.Sleep(2 * time.Second)
	if x := c.ShardMap(table, 0); slices.Contains(x.Replicas, victimID) {
		t.Errorf("%s appended again within 2 s of its disk failing: %v", victimID, x.Replicas)
	}
}

// TestChainLeftReplicaDeleted kills a chain member long enough for the
// metadata leader to replace it with another node, restarts it, and checks
// that the replica it left on disk is deleted once it is back (its map
// already says it was removed, so it never reopens the replica), that it
// is not a member, and that the chain's row is intact.
func TestChainLeftReplicaDeleted(t *testing.T) {
	waitsMostly(t)
	c := StartClusterWith(t, 4, FastRaft(), func(cfg *shard.NodeConfig) { cfg.RepairGrace = 2 * time.Second })
	const table = "cleft"
	cl, sm := c.oneChainPushed(table)
	victimID, vi, dir := c.middleReplica(sm)
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("%s's chain replica is not at %s: %v", victimID, dir, err)
	}
	c.Kill(vi)
	after := c.waitChain(table, 0, 20*time.Second, victimID+" replaced", func(x *shardpb.ShardMap) bool {
		return !slices.Contains(x.Replicas, victimID) && len(x.Replicas) == 3 && x.Adding == ""
	})
	t.Logf("%s replaced: order %v, epoch %d", victimID, after.Replicas, after.Epoch)
	c.Start(vi)
	c.waitFor(20*time.Second, victimID+" deletes its left-behind replica", func() bool {
		_, err := os.Stat(dir)
		return errors.Is(err, fs.ErrNotExist)
	})
	if x := c.ShardMap(table, 0); slices.Contains(x.Replicas, victimID) || c.Node(vi).Chain(table, 0) != nil {
		t.Errorf("%s is a member again (%v) or holds the replica open; the test expects the map to leave it out", victimID, x.Replicas)
	}
	c.pushSecond(cl, table)
}

// TestChainRestartedMemberKeepsItsReplica kills a chain member until the
// metadata leader removes it (three nodes: nobody can replace it), restarts
// it and checks that it is appended again with the replica it left on disk
// (a marker file put there while it was down survives), not a replica
// deleted and rebuilt from a snapshot, and that the row is intact.
func TestChainRestartedMemberKeepsItsReplica(t *testing.T) {
	c := StartCluster(t, 3, FastRaft())
	const table = "ckeep"
	cl, sm := c.oneChainPushed(table)
	victimID, vi, dir := c.middleReplica(sm)
	c.Kill(vi)
	c.waitChain(table, 0, 20*time.Second, victimID+" removed", func(x *shardpb.ShardMap) bool { return !slices.Contains(x.Replicas, victimID) })
	marker := filepath.Join(dir, "test-marker")
	if err := os.WriteFile(marker, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	c.Start(vi)
	after := c.waitChain(table, 0, 30*time.Second, victimID+" appended again", func(x *shardpb.ShardMap) bool { return slices.Contains(x.Replicas, victimID) })
	c.waitFor(10*time.Second, victimID+" opens its replica", func() bool { return c.Node(vi).Chain(table, 0) != nil })
	t.Logf("%s appended again: order %v, epoch %d", victimID, after.Replicas, after.Epoch)
	if _, err := os.Stat(marker); err != nil {
		t.Errorf("%s's replica was deleted before it was appended again: %v", victimID, err)
	}
	c.pushSecond(cl, table)
}

// TestMetaConfirmWritesNoLog checks the metadata leader's answers to
// ConfirmChains: after the first of its term they add nothing to the
// metadata log (a leadership check, not a barrier, per question), they give
// the chain's current epoch, and a metadata leader cut off from the others
// gives none once they have moved the chain to a new epoch.
func TestMetaConfirmWritesNoLog(t *testing.T) {
	waitsMostly(t)
	c := StartClusterWith(t, 3, FastRaft(), func(cfg *shard.NodeConfig) { cfg.FaultInjection = true })
	const table = "cconfirm"
	_, sm := c.oneChainPushed(table)
	ctx := context.Background()
	meta := c.metaLeader()
	conn, err := grpc.NewClient(c.cfgs[meta].PeerAddr, c.PeerDialOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ps := shardpb.NewPeerClient(conn)
	group := fmt.Sprintf("%s/0", table)
	confirm := func(timeout time.Duration) (uint64, error) {
		cctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		resp, err := ps.ConfirmChains(cctx, &shardpb.ConfirmChainsRequest{Groups: []string{group}})
		if err != nil {
			return 0, err
		}
		return resp.Epochs[0], nil
	}
	if _, err := confirm(2 * time.Second); err != nil {
		t.Fatal(err)
	}
	before := c.Node(meta).MetaRaft().LastIndex()
	const asks = 50
	for range asks {
		e, err := confirm(2 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if cur := c.ShardMap(table, 0).Epoch; e != cur {
			t.Fatalf("confirmed epoch %d, the map's is %d", e, cur)
		}
	}
	grew := c.Node(meta).MetaRaft().LastIndex() - before
	t.Logf("%d confirmations added %d entries to the metadata log", asks, grew)
	if grew >= asks/5 {
		t.Errorf("%d confirmations added %d entries to the metadata log", asks, grew)
	}
	cut := time.Now()

	// Cut the metadata leader off; the others elect another, which removes
	// it from the chain (a new epoch). The old leader must not confirm the
	// old epoch after that.
	c.cutOff(meta)
	defer c.heal()
	var moved *shardpb.ShardMap
	c.waitFor(20*time.Second, "the others move the chain on without "+c.ID(meta), func() bool {
		for i := range c.Len() {
			if i != meta {
				if x := c.Node(i).ClusterMap(); x != nil {
					for _, s := range x.Shards {
						if s.Table == table && s.Epoch > sm.Epoch && !slices.Contains(s.Replicas, c.ID(meta)) {
							moved = s
							return true
						}
					}
				}
			}
		}
		return false
	})
	t.Logf("chain moved on to %v (epoch %d) %s after the cut", moved.Replicas, moved.Epoch, time.Since(cut).Round(time.Millisecond))
	asked := time.Now()
	e, err := confirm(time.Second)
	t.Logf("the cut-off %s answered in %s: %d, %v", c.ID(meta), time.Since(asked).Round(time.Millisecond), e, err)
	if err == nil {
		t.Errorf("cut-off metadata leader %s confirmed epoch %d after the chain moved on to %d", c.ID(meta), e, moved.Epoch)
	}
}
