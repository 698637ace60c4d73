package test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/raftps/raftps/replication"
	"github.com/raftps/raftps/shard"
)

// TestClusterUpgradeToSharedLog: a cluster whose shard replicas have Raft
// logs of their own in raft.db files (BoltLogs, the default before segment
// logs) is stopped and restarted with the shared log (SharedLog). The old
// replicas open from their raft.db files with everything acknowledged in
// them and go on taking pushes there; a table created after the restart
// has its replicas in the shared log.
func TestClusterUpgradeToSharedLog(t *testing.T) { testClusterUpgrade(t, "log-id") }

// TestClusterUpgradeToSegLogs: the same, restarted with the default
// (segment logs): old replicas keep raft.db, new ones get wal/.
func TestClusterUpgradeToSegLogs(t *testing.T) { testClusterUpgrade(t, replication.SegLogDir) }

func testClusterUpgrade(t *testing.T, newKind string) {
	waitsMostly(t)
	c := StartClusterWith(t, 3, FastRaft(), func(cfg *shard.NodeConfig) { cfg.BoltLogs = true })
	ctx := context.Background()
	spec, err := c.Client().Tables().Create(ctx, counterSpec("old", 2))
	if err != nil {
		t.Fatal(err)
	}
	l := newLedger(t, spec)
	pushLoad(t, c, l, "old", 2, 30, nil)
	for i := range 3 {
		c.Kill(i)
	}
	c.mu.Lock()
	for i := range c.cfgs {
		c.cfgs[i].SharedLog = newKind == "log-id"
		c.cfgs[i].BoltLogs = false
	}
	c.mu.Unlock()
	for i := range 3 {
		c.Start(i)
	}
	c.WaitMetaLeader(10 * time.Second)
	verify(t, c, l, "old")
	pushLoad(t, c, l, "old", 2, 30, nil)
	verify(t, c, l, "old")

	nspec, err := c.Client().Tables().Create(ctx, counterSpec("new", 2))
	if err != nil {
		t.Fatal(err)
	}
	nl := newLedger(t, nspec)
	pushLoad(t, c, nl, "new", 2, 30, nil)
	verify(t, c, nl, "new")
	for i := range 3 {
		data := c.cfgs[i].DataDir
		for table, want := range map[string]string{"old": "raft.db", "new": newKind} {
			other := map[string]string{"raft.db": newKind, newKind: "raft.db"}[want]
			dir := filepath.Join(data, "groups", table, "0")
			if _, err := os.Stat(filepath.Join(dir, want)); err != nil {
				t.Errorf("%s: %v", dir, err)
			}
			if _, err := os.Stat(filepath.Join(dir, other)); err == nil {
				t.Errorf("%s holds a %s too", dir, other)
			}
		}
	}
}
