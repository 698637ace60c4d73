package test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/raftps/raftps/shard/api"
	"github.com/raftps/raftps/shard/client"
	"github.com/raftps/raftps/test/localcluster"
)

// mountTmpfs mounts a tmpfs of size at dir until the test ends (after the
// cleanups registered later, such as the cluster's, have run), or skips
// the test if this process may not mount.
func mountTmpfs(t *testing.T, dir, size string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("needs a small file system for a node's data dir: mounting a %s tmpfs is not permitted here (%v: %s); run as root", size, err, strings.TrimSpace(string(out)))
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Logf("umount %s: %v: %s", dir, err, out)
		}
	})
}

// fillDisk writes path until the file system is full and returns how many
// bytes it wrote.
func fillDisk(t *testing.T, path string) int64 {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 256<<10)
	var n int64
	for {
		k, err := f.Write(buf)
		n += int64(k)
		if errors.Is(err, syscall.ENOSPC) {
			return n
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// TestBinaryFullDisk: n2's data dir is a 64 MiB tmpfs, the others' on the
// big disk; the servers refuse pushes below 16 MiB free. A Raft table is
// pushed to, then n2's disk is filled to the last byte. Pushes to the
// shards n2 leads are refused with ResourceExhausted, "disk full on n2";
// pushes to the other shards go on (n2's followers take no entries; the
// other two replicas commit); every pull is answered; status says n2's
// disk is full. n1 is killed and restarted meanwhile, so n2's replicas
// write new terms on the full disk (hashicorp/raft panics when it cannot).
// Then the filler is deleted: pushes to n2's shards resume by themselves,
// n2's replicas catch up, every shard's replicas agree, every acknowledged
// push is in the rows exactly once, and no server died.
func TestBinaryFullDisk(t *testing.T) {
	waitsMostly(t)
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildBinary(t)
	dir := filepath.Join(t.TempDir(), "cluster")
	n2data := filepath.Join(dir, "n2", "data")
	mountTmpfs(t, n2data, "64m")
	cluster := binaryClusterAt(t, bin, dir, 3, 0, "--disk-min-free-mib 16 --disk-reserve-mib 4")
	lc, err := localcluster.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	lc.Binary = bin
	newClient := elasticClient(t, cluster)
	cl := newClient()
	defer cl.Close()
	ctx := context.Background()
	spec, err := cl.Tables().Create(ctx, counterSpec("emb", 6))
	if err != nil {
		t.Fatal(err)
	}
	l := newLedger(t, spec)
	load := startClientLoad(t, newClient, l, "emb", 2)
	waitAcked(t, l, 0, 50, 60*time.Second, "pushes before the disk fills")
	load.Stop()

	// Leaders are balanced after a table is created: n2 should lead a
	// shard before its disk fills, so the refusal below is exercised.
	waitCLIStatus(t, bin, cluster, 30*time.Second, "n2 leads a shard", func(st *client.ClusterStatus) string {
		for _, r := range st.Replicas {
			if r.Group != "meta" && r.State == "leader" && r.Node == "n2" {
				return ""
			}
		}
		return "n2 leads no shard"
	})
	filler := filepath.Join(n2data, "filler")
	t.Logf("filled n2's disk with %d MiB", fillDisk(t, filler)>>20)
	var n2Shard, otherShard int
	st := waitCLIStatus(t, bin, cluster, 30*time.Second, "status says n2's disk is full, another node leads a shard", func(st *client.ClusterStatus) string {
		if n, ok := st.Node("n2"); !ok || n.Disk == nil || !n.Disk.Full {
			return "n2's disk is not full in status"
		}
		// Keys of a shard n2 leads, and of one it does not.
		n2Shard, otherShard = -1, -1
		for _, r := range st.Replicas {
			if r.Group == "meta" || r.State != "leader" {
				continue
			}
			switch {
			case r.Node == "n2" && n2Shard < 0:
				n2Shard = shardOfGroup(t, r.Group)
			case r.Node != "n2" && otherShard < 0:
				otherShard = shardOfGroup(t, r.Group)
			}
		}
		if otherShard < 0 {
			return "no shard led by a node other than n2"
		}
		return ""
	})
	n2, _ := st.Node("n2")
	t.Logf("n2's disk: %+v", *n2.Disk)
	keyOf := func(shard int) uint64 {
		for k := uint64(0); ; k++ {
			if int(api.ShardOf(k, uint32(spec.Shards))) == shard {
				return k
			}
		}
	}
	kOther := keyOf(otherShard)
	push := func(k uint64) error {
		grads := make([]float32, spec.Dim)
		for i := range grads {
			grads[i] = 1
		}
		err := cl.Push(ctx, "emb", []uint64{k}, grads)
		if err == nil {
			l.record(t, []uint64{k}, grads)
		}
		return err
	}
	// A leader whose log write fails steps down, and leadership may move
	// (balancing, expedited elections): a push to a shard n2 led a moment
	// ago may find another leader, which takes it. One that reaches n2
	// leading must be refused, naming the limit. n2 may also lead nothing
	// by now (a full-disk node cannot commit the entry that starts its
	// term, so it does not keep a leadership it is given): then every
	// shard takes pushes, which is what the refusal protects anyway.
	refuseBy := time.Now().Add(30 * time.Second)
	for n2Shard >= 0 {
		err := push(keyOf(n2Shard))
		if errors.Is(err, api.ErrDiskFull) && strings.Contains(err.Error(), "disk full on n2") {
			t.Logf("push refused as it should be: %v", err)
			break
		}
		if err != nil {
			t.Fatalf("push to shard %d, led by n2 on a full disk: %v; want DISK_FULL, \"disk full on n2\"", n2Shard, err)
		}
		t.Logf("push to shard %d was taken: n2 no longer leads it", n2Shard)
		if time.Now().After(refuseBy) {
			n2Shard = -1
			break
		}
		time.Sleep(500 * time.Millisecond)
		n2Shard = -1
		if st, err := statusJSON(bin, cluster); err == nil {
			for _, r := range st.Replicas {
				if r.Group != "meta" && r.State == "leader" && r.Node == "n2" {
					n2Shard = shardOfGroup(t, r.Group)
					break
				}
			}
		}
	}
	if n2Shard < 0 {
		t.Logf("n2 leads no shard on its full disk; every shard takes pushes")
		for sh := range spec.Shards {
			if err := push(keyOf(sh)); err != nil {
				t.Fatalf("push to shard %d while n2's disk is full and n2 leads nothing: %v", sh, err)
			}
		}
		n2Shard = otherShard
	}
	kFull := keyOf(n2Shard)
	for range 20 {
		if err := push(kOther); err != nil {
			t.Fatalf("push to shard %d, led by another node, while n2's disk is full: %v", otherShard, err)
		}
	}
	verifyPulls(t, cl, l, "emb")

	// New terms on the full disk: n1's groups elect new leaders.
	if err := lc.Kill("n1"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	if err := lc.Start(mustNode(t, lc, "n1")); err != nil {
		t.Fatal(err)
	}
	if _, alive := lc.PID("n2"); !alive {
		t.Fatalf("n2 died on its full disk:\n%s", lc.LogTail("n2", 30))
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	deadline := start.Add(60 * time.Second)
	for {
		err := push(kFull)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pushes to n2's shard did not resume within a minute of freeing its disk: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("pushes to shard %d resumed %s after the filler was deleted", n2Shard, time.Since(start).Round(100*time.Millisecond))
	load = startClientLoad(t, newClient, l, "emb", 2)
	waitAcked(t, l, l.acked.Load(), 50, 60*time.Second, "pushes after space returned")
	load.Stop()
	waitReplicasAgree(t, bin, cluster, 3, 90*time.Second)
	verifyPulls(t, cl, l, "emb")
	for _, id := range []string{"n1", "n2", "n3"} {
		if _, alive := lc.PID(id); !alive {
			t.Errorf("%s is not running", id)
		}
	}
	if log := lc.LogTail("n2", 100000); !strings.Contains(log, "disk full") || !strings.Contains(log, "accepting pushes again") {
		t.Errorf("n2's log does not say when its disk filled and when pushes resumed")
	}
	waitCLIStatus(t, bin, cluster, 10*time.Second, "status says n2's disk has room", func(st *client.ClusterStatus) string {
		if n, ok := st.Node("n2"); !ok || n.Disk == nil || n.Disk.Full {
			return "n2's disk is still full in status"
		}
		return ""
	})
}

// shardOfGroup is the shard of a group ID "table/shard" (status --json
// gives replicas by group).
func shardOfGroup(t *testing.T, group string) int {
	t.Helper()
	var s int
	if _, err := fmt.Sscanf(group[strings.LastIndexByte(group, '/')+1:], "%d", &s); err != nil {
		t.Fatalf("group %q: %v", group, err)
	}
	return s
}
