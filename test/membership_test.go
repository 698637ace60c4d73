package test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/raftps/raftps/shard/client"
)

// statusOf asks node i for its Status.
func statusOf(t *testing.T, c *Cluster, i int) (client.NodeStatus, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return c.Client().Admin().NodeStatus(ctx, c.Addrs()[i], false)
}

// nodeStates returns node ID -> gossip state as st reports them.
func nodeStates(st client.NodeStatus) map[string]string {
	out := map[string]string{}
	for _, n := range st.Nodes {
		out[n.ID] = n.State
	}
	return out
}

// waitStatus waits until every listed node's Status satisfies ok.
func waitStatus(t *testing.T, c *Cluster, nodes []int, timeout time.Duration, what string, ok func(client.NodeStatus) bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		var last client.NodeStatus
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
			t.Fatalf("after %s, not every node reports %s; last status: %+v", timeout, what, last)
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
	if _, err := c.Client().Tables().Create(ctx, counterSpec("members", 2)); err != nil {
		t.Fatal(err)
	}
	allAlive := func(st client.NodeStatus) bool {
		s := nodeStates(st)
		return len(s) == 3 && s["n1"] == "alive" && s["n2"] == "alive" && s["n3"] == "alive" && st.UnderReplicated == 0
	}
	waitStatus(t, c, []int{0, 1, 2}, 10*time.Second, "3 nodes alive", allAlive)

	// Counts: every node hosts every shard; the leaders add up to the shards
	// once every node has gossiped its count (each does on its reconcile
	// pass, every second).
	leaderSum := func(st client.NodeStatus) int {
		sum := 0
		for _, n := range st.Nodes {
			sum += n.Leaders
		}
		return sum
	}
	var st client.NodeStatus
	waitStatus(t, c, []int{0}, 10*time.Second, "gossiped leader counts adding up to the shards", func(s client.NodeStatus) bool {
		st = s
		return leaderSum(s) == shards
	})
	leaders := 0
	for _, n := range st.Nodes {
		if n.Replicas != shards {
			t.Errorf("node %s hosts %d replicas, want %d", n.ID, n.Replicas, shards)
		}
		if n.Addr != c.Addrs()[n.ID[1]-'1'] {
			t.Errorf("node %s at %q, want %q", n.ID, n.Addr, c.Addrs()[n.ID[1]-'1'])
		}
		leaders += n.Leaders
	}
	if leaders != shards {
		t.Errorf("leaders add up to %d, want %d: %v", leaders, shards, st.Nodes)
	}

	c.Kill(2)
	start := time.Now()
	waitStatus(t, c, []int{0, 1}, 5*time.Second, "n3 dead, all shards under-replicated", func(st client.NodeStatus) bool {
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

	// status is raftps status --json, decoded with the client's own type.
	type status = client.ClusterStatus
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
