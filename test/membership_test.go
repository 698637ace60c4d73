package test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/raftps/raftps/shard/shardpb"
)

// statusOf asks node i for its Status.
func statusOf(t *testing.T, c *Cluster, i int) (*shardpb.StatusResponse, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return c.Client().Status(ctx, c.Addrs()[i])
}

// nodeStates returns node ID -> gossip state as st reports them.
func nodeStates(st *shardpb.StatusResponse) map[string]string {
	out := map[string]string{}
	for _, n := range st.Nodes {
		out[n.Id] = n.State
	}
	return out
}

// waitStatus waits until every listed node's Status satisfies ok.
func waitStatus(t *testing.T, c *Cluster, nodes []int, timeout time.Duration, what string, ok func(*shardpb.StatusResponse) bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		var last *shardpb.StatusResponse
		good := true
		for _, i := range nodes {
			st, err := statusOf(t, c, i)
			if err != nil || !ok(st) {
				good, last = false, st
				break
			}
		}
		if good {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s, not every node reports %s; last status: %v", timeout, what, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestMembershipStatus: gossip sees all three nodes alive from each node; a
// node that goes away is reported dead by the others and every shard of a
// table is under-replicated; back, it is alive again and nothing is
// under-replicated.
func TestMembershipStatus(t *testing.T) {
	waitsMostly(t)
	c := StartCluster(t, 3, FastRaft())
	ctx := context.Background()
	if _, err := c.Client().CreateTable(ctx, counterSpec("members", 2)); err != nil {
		t.Fatal(err)
	}
	allAlive := func(st *shardpb.StatusResponse) bool {
		s := nodeStates(st)
		return len(s) == 3 && s["n1"] == "alive" && s["n2"] == "alive" && s["n3"] == "alive" && st.UnderReplicated == 0
	}
	waitStatus(t, c, []int{0, 1, 2}, 10*time.Second, "3 nodes alive", allAlive)

	// Counts: every node hosts every shard; the leaders add up to the shards
	// once every node has gossiped its count (each does on its reconcile
	// pass, every second).
	leaderSum := func(st *shardpb.StatusResponse) uint32 {
		sum := uint32(0)
		for _, n := range st.Nodes {
			sum += n.Leaders
		}
		return sum
	}
	var st *shardpb.StatusResponse
	waitStatus(t, c, []int{0}, 10*time.Second, "gossiped leader counts adding up to the shards", func(s *shardpb.StatusResponse) bool {
		st = s
		return leaderSum(s) == shards
	})
	leaders := uint32(0)
	for _, n := range st.Nodes {
		if n.Replicas != shards {
			t.Errorf("node %s hosts %d replicas, want %d", n.Id, n.Replicas, shards)
		}
		if n.Addr != c.Addrs()[n.Id[1]-'1'] {
			t.Errorf("node %s at %q, want %q", n.Id, n.Addr, c.Addrs()[n.Id[1]-'1'])
		}
		leaders += n.Leaders
	}
	if leaders != shards {
		t.Errorf("leaders add up to %d, want %d: %v", leaders, shards, st.Nodes)
	}

	c.Kill(2)
	start := time.Now()
	waitStatus(t, c, []int{0, 1}, 5*time.Second, "n3 dead, all shards under-replicated", func(st *shardpb.StatusResponse) bool {
		return nodeStates(st)["n3"] == "dead" && st.UnderReplicated == shards
	})
	t.Logf("n3 reported dead after %s", time.Since(start).Round(time.Millisecond))

	c.Start(2)
	start = time.Now()
	waitStatus(t, c, []int{0, 1, 2}, 10*time.Second, "3 nodes alive again", allAlive)
	t.Logf("n3 reported alive again after %s", time.Since(start).Round(time.Millisecond))
}

// TestBinaryMembershipSIGKILL: a node killed with SIGKILL (no graceful
// leave) is found dead by gossip, and raftps status --json shows it, with
// every shard under-replicated.
func TestBinaryMembershipSIGKILL(t *testing.T) {
	waitsMostly(t)
	bin, dir, cluster := binaryCluster(t, fastTimeouts)
	raftps := func(args ...string) string { t.Helper(); return runRaftps(t, bin, args...) }
	raftps("table", "create", "emb", "--dim", "2", "--shards", "4", "--cluster", cluster)

	type status struct {
		Nodes []struct {
			ID       string `json:"id"`
			State    string `json:"state"`
			Replicas uint32 `json:"replicas"`
			Leaders  uint32 `json:"leaders"`
		} `json:"nodes"`
		UnderReplicated uint32 `json:"under_replicated"`
	}
	wait := func(timeout time.Duration, what string, ok func(status) bool) {
		t.Helper()
		deadline := time.Now().Add(timeout)
		var st status
		for {
			// Ask the survivors only: a SIGKILLed node's address times out.
			out := raftps("status", "--json", "--timeout", "1s", "--cluster", cluster)
			st = status{}
			if err := json.Unmarshal([]byte(out), &st); err != nil {
				t.Fatalf("status --json: %v\n%s", err, out)
			}
			if ok(st) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("after %s, status does not show %s: %+v", timeout, what, st)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	states := func(st status) map[string]string {
		m := map[string]string{}
		for _, n := range st.Nodes {
			m[n.ID] = n.State
		}
		return m
	}
	wait(20*time.Second, "3 nodes alive", func(st status) bool {
		s := states(st)
		return s["n1"] == "alive" && s["n2"] == "alive" && s["n3"] == "alive" && st.UnderReplicated == 0
	})
	raftps("cluster", "kill", "n3", "--dir", dir)
	start := time.Now()
	// memberlist's LAN defaults: probe every 1s, dead 4s after suspicion.
	wait(30*time.Second, "n3 dead", func(st status) bool {
		return states(st)["n3"] == "dead" && st.UnderReplicated == 4
	})
	t.Logf("SIGKILLed n3 reported dead after %s", time.Since(start).Round(time.Millisecond))
}
