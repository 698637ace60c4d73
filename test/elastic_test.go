package test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/raftps/raftps/shard"
	"github.com/raftps/raftps/shard/shardpb"
)

// elasticGrace is the repair grace period of the elastic tests: long enough
// that a node restarted at once is not replaced, short enough for a test.
const elasticGrace = 3 * time.Second

func elasticCluster(t *testing.T, n int) *Cluster {
	return StartClusterWith(t, n, FastRaft(), func(cfg *shard.NodeConfig) {
		cfg.RepairGrace = elasticGrace
		cfg.MaxMoves = 4
	})
}

// elasticStart starts 5 nodes with table "el" (16 shards, 3 replicas)
// placed and led, and a ledger of pushes to it.
func elasticStart(t *testing.T) (*Cluster, *ledger) {
	c := elasticCluster(t, 5)
	spec, err := c.Client().CreateTable(context.Background(), elasticSpec("el"))
	if err != nil {
		t.Fatal(err)
	}
	c.waitSettled(t, "el", 3, nil, 10*time.Second)
	return c, newLedger(t, spec)
}

func elasticSpec(name string) *shardpb.TableSpec {
	s := counterSpec(name, 2)
	s.Shards, s.Replicas = 16, 3
	return s
}

// liveMap returns the map of a live node that leads the metadata group, or
// of any live node if none does.
func (c *Cluster) liveMap() *shardpb.ClusterMap {
	var any *shardpb.ClusterMap
	for i := range c.Len() {
		if n := c.Node(i); n != nil {
			if n.MetaRaft().State() == raft.Leader {
				return n.ClusterMap()
			}
			any = n.ClusterMap()
		}
	}
	return any
}

// settled reports why table's placement is not settled yet ("" if it is):
// every shard has want replicas, none on a node in dead, none being added,
// and each group's Raft configuration (as its leader has it) is exactly the
// map's replica set, all voters.
func (c *Cluster) settled(table string, want int, dead []string) string {
	cm := c.liveMap()
	if cm == nil {
		return "no live node"
	}
	for _, sm := range cm.Shards {
		if sm.Table != table {
			continue
		}
		switch {
		case sm.Adding != "":
			return fmt.Sprintf("%s/%d: adding %s", table, sm.Shard, sm.Adding)
		case len(sm.Replicas) != want:
			return fmt.Sprintf("%s/%d: replicas %v", table, sm.Shard, sm.Replicas)
		}
		for _, d := range dead {
			if slices.Contains(sm.Replicas, d) {
				return fmt.Sprintf("%s/%d: replicas %v include dead %s", table, sm.Shard, sm.Replicas, d)
			}
		}
		var leader *shard.Node
		for i := range c.Len() {
			if n := c.Node(i); n != nil {
				if g := n.Group(table, sm.Shard); g != nil && g.IsLeader() {
					leader = n
				}
			}
		}
		if leader == nil {
			return fmt.Sprintf("%s/%d: no leader", table, sm.Shard)
		}
		f := leader.Group(table, sm.Shard).Raft().GetConfiguration()
		if f.Error() != nil {
			return f.Error().Error()
		}
		var voters []string
		for _, srv := range f.Configuration().Servers {
			if srv.Suffrage != raft.Voter {
				return fmt.Sprintf("%s/%d: non-voter %s", table, sm.Shard, srv.ID)
			}
			voters = append(voters, string(srv.ID))
		}
		slices.Sort(voters)
		mapped := slices.Sorted(slices.Values(sm.Replicas))
		if !slices.Equal(voters, mapped) {
			return fmt.Sprintf("%s/%d: Raft voters %v, map %v", table, sm.Shard, voters, mapped)
		}
	}
	return ""
}

func (c *Cluster) waitSettled(t *testing.T, table string, want int, dead []string, timeout time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	why := ""
	for time.Since(start) < timeout {
		if why = c.settled(table, want, dead); why == "" {
			return time.Since(start)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("placement of %s not settled after %s: %s", table, timeout, why)
	return 0
}

// loads counts, per live node, the replicas the map places on it and the
// groups it leads.
func (c *Cluster) loads(table string) (replicas, leaders map[string]int) {
	replicas, leaders = map[string]int{}, map[string]int{}
	for _, sm := range c.liveMap().Shards {
		if sm.Table != table {
			continue
		}
		for _, id := range sm.Replicas {
			replicas[id]++
		}
	}
	for i := range c.Len() {
		if n := c.Node(i); n != nil {
			for s := range uint32(16) {
				if g := n.Group(table, s); g != nil && g.IsLeader() {
					leaders[n.ID()]++
				}
			}
		}
	}
	return replicas, leaders
}

// waitBalanced waits until every live node holds at most ceil(S·R/N)+1
// replicas and leads at most ceil(S/N)+1 shards, and also (its share) at
// least floor(S·R/N) and floor(S/N).
func (c *Cluster) waitBalanced(t *testing.T, table string, live []string, timeout time.Duration) {
	t.Helper()
	n := len(live)
	maxRep, maxLead := (16*3+n-1)/n+1, (16+n-1)/n+1
	minRep, minLead := 16*3/n, 16/n
	deadline := time.Now().Add(timeout)
	for {
		reps, leads := c.loads(table)
		ok := true
		for _, id := range live {
			if reps[id] > maxRep || leads[id] > maxLead || reps[id] < minRep || leads[id] < minLead {
				ok = false
			}
		}
		if ok {
			t.Logf("balanced over %v: replicas %v (bounds %d..%d), leaders %v (bounds %d..%d)", live, reps, minRep, maxRep, leads, minLead, maxLead)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not balanced after %s: replicas %v (bounds %d..%d), leaders %v (bounds %d..%d)", timeout, reps, minRep, maxRep, leads, minLead, maxLead)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestElasticRepairAndJoin: a 5-node cluster with a 16-shard, 3-replica
// table under push load. One node is killed for good: within the grace
// period and a bounded time every shard has 3 replicas on live nodes again.
// A sixth node joins: it gets its share of replicas and leaders. Throughout,
// no acknowledged push is lost or applied twice, and the replicas of every
// shard end bit-identical to a single-node reference.
func TestElasticRepairAndJoin(t *testing.T) {
	if testing.Short() {
		t.Skip("elastic cluster test takes about a minute")
	}
	c, l := elasticStart(t)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		pushLoad(t, c, l, "el", 4, 1<<30, stop)
	}()
	waitAcked := func(n int64) {
		before := l.acked.Load()
		for l.acked.Load() < before+n {
			time.Sleep(5 * time.Millisecond)
		}
	}
	waitAcked(200)

	// Kill the node leading the most shards, for good.
	_, leads := c.loads("el")
	victim := 0
	for i := range c.Len() {
		if leads[c.ID(i)] > leads[c.ID(victim)] {
			victim = i
		}
	}
	killed := time.Now()
	c.Kill(victim)
	dead := []string{c.ID(victim)}
	took := c.waitSettled(t, "el", 3, dead, elasticGrace+60*time.Second)
	t.Logf("killed %s leading %d shards; 3 live replicas everywhere %s later (grace %s)", c.ID(victim), leads[c.ID(victim)], took.Round(time.Millisecond), elasticGrace)
	if d := time.Since(killed); d < elasticGrace {
		t.Errorf("repaired %s after the kill, before the grace period %s", d, elasticGrace)
	}
	waitAcked(200)

	// A sixth node joins and takes its share.
	joined := c.AddNode()
	var live []string
	for i := range c.Len() {
		if i != victim {
			live = append(live, c.ID(i))
		}
	}
	c.waitBalanced(t, "el", live, 60*time.Second)
	c.waitSettled(t, "el", 3, dead, 30*time.Second)
	if reps, _ := c.loads("el"); reps[c.ID(joined)] == 0 {
		t.Fatalf("joined node %s holds no replica", c.ID(joined))
	}
	waitAcked(200)
	close(stop)
	<-done
	verify(t, c, l, "el")
}

// TestElasticMetaLeaderKilledDuringRepair kills the metadata leader while a
// repair is under way (a shard is being given a new replica) and restarts
// it: the new metadata leader resumes the repair, and the map ends correct.
func TestElasticMetaLeaderKilledDuringRepair(t *testing.T) {
	if testing.Short() {
		t.Skip("elastic cluster test takes about a minute")
	}
	c, l := elasticStart(t)
	pushLoad(t, c, l, "el", 4, 100, nil)

	metaLeader := func() int {
		for i := range c.Len() {
			if n := c.Node(i); n != nil && n.MetaRaft().State() == raft.Leader {
				return i
			}
		}
		return -1
	}
	ml := metaLeader()
	victim := (ml + 1) % c.Len()
	c.Kill(victim)
	// Wait for a repair step to be under way, then kill the metadata leader.
	deadline := time.Now().Add(elasticGrace + 20*time.Second)
	for {
		moving := false
		for _, sm := range c.liveMap().Shards {
			moving = moving || sm.Adding != ""
		}
		if moving {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no repair started")
		}
		time.Sleep(2 * time.Millisecond)
	}
	ml = metaLeader()
	t.Logf("repair under way; killing metadata leader %s", c.ID(ml))
	c.Kill(ml)
	time.Sleep(time.Second)
	c.Start(ml)
	c.waitSettled(t, "el", 3, []string{c.ID(victim)}, elasticGrace+60*time.Second)
	verify(t, c, l, "el")
}
