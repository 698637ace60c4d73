package test

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/raftps/raftps/replication"
	"github.com/raftps/raftps/shard/client"
	"github.com/raftps/raftps/test/localcluster"
)

// Bad files and a full disk, against real server processes (issue 22;
// docs/RELIABILITY.md, "Bad files" and "Full disk").

// scrambleBoltRoot overwrites the header of the root page of the bolt file
// at path (as its newer meta page names it) with garbage: bbolt's freelist
// scan at open panics on it in a goroutine of its own, which no recover
// reaches.
func scrambleBoltRoot(t *testing.T, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	le := binary.LittleEndian
	meta := func(off int) (pageSize, root, txid uint64) {
		m := b[off+16:]
		return uint64(le.Uint32(m[8:])), le.Uint64(m[16:]), le.Uint64(m[48:])
	}
	ps, root, tx0 := meta(0)
	_, root1, tx1 := meta(int(ps))
	if tx1 > tx0 {
		root = root1
	}
	off := int(root * ps)
	for i := off; i < off+32; i++ {
		b[i] ^= 0xa5
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// truncateHalf cuts the file at path to half its length.
func truncateHalf(t *testing.T, path string) {
	t.Helper()
	info, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, info.Size()/2); err != nil {
		t.Fatal(err)
	}
}

// waitReplicasAgree waits until every shard group of the cluster has
// replicas replicas at one applied index with one checksum.
func waitReplicasAgree(t *testing.T, bin, cluster string, replicas int, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		why := ""
		out, err := exec.Command(bin, "status", "--json", "--checksums", "--timeout", "3s", "--cluster", cluster).Output()
		st := &client.ClusterStatus{}
		if err == nil {
			err = json.Unmarshal(out, st)
		}
		if err != nil {
			why = err.Error()
		} else {
			groups := map[string][]client.ReplicaStatus{}
			for _, r := range st.Replicas {
				if r.Group != "meta" {
					groups[r.Group] = append(groups[r.Group], r)
				}
			}
			for _, g := range slices.Sorted(maps.Keys(groups)) {
				rs := groups[g]
				if len(rs) != replicas {
					why = fmt.Sprintf("%s has %d replicas", g, len(rs))
					break
				}
				for _, r := range rs {
					if r.Checksum == nil || r.Applied != rs[0].Applied || *r.Checksum != *rs[0].Checksum {
						why = fmt.Sprintf("%s: replicas differ (%s at %d, %s at %d)", g, rs[0].Node, rs[0].Applied, r.Node, r.Applied)
						break
					}
				}
			}
		}
		if why == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("replicas do not agree after %s: %s", timeout, why)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// TestBinaryCorruptReplicaRebuilt: a node is SIGKILLed under push load,
// one of its files is damaged, and it is restarted. First n2: bytes of the
// root page of a Raft shard's log and of a chain shard's log are
// scrambled (bbolt panicked at open on such a page, and the node died in a
// loop). Then n3: the same two kinds of file are truncated to half (bbolt
// faulted on its mapping). Each time the node comes up and serves, the bad
// replicas are set aside (named in status, their files kept), removed from
// their shards and rebuilt from their peers; afterwards nothing is
// under-replicated, every shard's replicas agree, and every acknowledged
// push is in the rows exactly once.
//
// The Raft shard's log here is a segment log (the default): its damage is
// 32 bytes scrambled in the middle of the segment both times, inside an
// append that later ones follow. (A segment cut short looks like an append
// a crash tore, which is cut and repaired from the leader, not set aside:
// see replication.SegLog.)
func TestBinaryCorruptReplicaRebuilt(t *testing.T) { testCorruptReplicaRebuilt(t, "segments") }

// TestBinaryCorruptSharedLogRebuilt is TestBinaryCorruptReplicaRebuilt
// with the Raft shards' logs in each node's shared log (--shared-log), and
// that file damaged: the node starts with the file set aside and an empty
// one, and every Raft replica it held (step.shard's among them) is set
// aside and rebuilt; it does not die at every start.
func TestBinaryCorruptSharedLogRebuilt(t *testing.T) { testCorruptReplicaRebuilt(t, "shared") }

// scrambleMiddle flips 32 bytes in the middle of the file at path.
func scrambleMiddle(t *testing.T, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) < 4096 {
		t.Fatalf("%s has only %d bytes", path, len(b))
	}
	for i := len(b) / 2; i < len(b)/2+32; i++ {
		b[i] ^= 0xa5
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// lastSegment is the newest segment file of a replica's segment log.
func lastSegment(t *testing.T, groupDir string) string {
	t.Helper()
	segs, err := filepath.Glob(filepath.Join(groupDir, replication.SegLogDir, "*.seg"))
	if err != nil || len(segs) == 0 {
		t.Fatalf("no segment in %s: %v", groupDir, err)
	}
	return segs[len(segs)-1]
}

// testCorruptReplicaRebuilt runs with the Raft shards' logs of kind
// "segments" (the default), "bolt" (a raft.db each) or "shared".
func testCorruptReplicaRebuilt(t *testing.T, kind string) {
	waitsMostly(t)
	args := slices.Clone(elasticServerArgs)
	switch kind {
	case "shared":
		args = append(args, "--shared-log")
	case "bolt":
		args = append(args, "--seg-log=false")
	}
	bin, dir, cluster := binaryClusterN(t, 3, 0, args...)
	newClient := elasticClient(t, cluster)
	cl := newClient()
	defer cl.Close()
	ctx := context.Background()
	rspec, err := cl.Tables().Create(ctx, counterSpec("emb", 4))
	if err != nil {
		t.Fatal(err)
	}
	cspec := counterSpec("chn", 2)
	cspec.Replication = client.Chain
	cspec, err = cl.Tables().Create(ctx, cspec)
	if err != nil {
		t.Fatal(err)
	}
	rl, chl := newLedger(t, rspec), newLedger(t, cspec)
	lc, err := localcluster.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	lc.Binary = bin
	for _, step := range []struct {
		node, what string
		damage     func(*testing.T, string)
		shard      int
	}{
		{"n2", "root page scrambled", scrambleBoltRoot, 0},
		{"n3", "truncated to half", truncateHalf, 1},
	} {
		rload := startClientLoad(t, newClient, rl, "emb", 2)
		cload := startClientLoad(t, newClient, chl, "chn", 1)
		waitAcked(t, rl, rl.acked.Load(), 100, 30*time.Second, "pushes before the kill")
		if err := lc.Kill(step.node); err != nil {
			t.Fatal(err)
		}
		data := filepath.Join(dir, step.node, "data")
		groupDir := filepath.Join(data, "groups", "emb", fmt.Sprint(step.shard))
		raftFile, raftDamage, raftWhat := filepath.Join(groupDir, "raft.db"), step.damage, step.what
		switch kind {
		case "shared":
			raftFile = filepath.Join(data, replication.NodeLogFile)
		case "segments":
			raftFile, raftDamage, raftWhat = lastSegment(t, groupDir), scrambleMiddle, "middle scrambled"
		}
		chainFile := filepath.Join(data, "chains", "chn", fmt.Sprint(step.shard), "chain.db")
		raftDamage(t, raftFile)
		step.damage(t, chainFile)
		t.Logf("%s killed; %s: %s; %s: %s", step.node, raftWhat, raftFile, step.what, chainFile)
		if err := lc.Start(mustNode(t, lc, step.node)); err != nil {
			t.Fatal(err)
		}
		want := []string{fmt.Sprintf("emb/%d", step.shard), fmt.Sprintf("chn/%d", step.shard)}
		waitCLIStatus(t, bin, cluster, 90*time.Second, step.node+" up, its bad replicas set aside and rebuilt", func(st *client.ClusterStatus) string {
			if n, ok := st.Node(step.node); !ok || n.RPC != "up" {
				return step.node + " does not answer"
			}
			for _, g := range want {
				i := slices.IndexFunc(st.SetAside, func(a client.SetAsideReplica) bool { return a.Node == step.node && a.Group == g })
				if i < 0 {
					return g + " is not listed as set aside on " + step.node
				}
				if a := st.SetAside[i]; !a.Reopened {
					return g + " set aside, not reopened yet"
				} else if _, err := os.Stat(filepath.Join(a.MovedTo, "REASON")); err != nil {
					return fmt.Sprintf("%s's files are not kept in %s: %v", g, a.MovedTo, err)
				}
			}
			if st.UnderReplicated != 0 || len(st.Moving) != 0 {
				return fmt.Sprintf("%d shards under-replicated, %d moving", st.UnderReplicated, len(st.Moving))
			}
			for _, g := range want {
				if !slices.ContainsFunc(st.Replicas, func(r client.ReplicaStatus) bool { return r.Group == g && r.Node == step.node }) {
					return g + " has no replica on " + step.node + " yet"
				}
			}
			return ""
		})
		// The rebuilt replicas take pushes like the others.
		waitAcked(t, rl, rl.acked.Load(), 100, 30*time.Second, "pushes after the rebuild")
		waitAcked(t, chl, chl.acked.Load(), 30, 30*time.Second, "chain pushes after the rebuild")
		rload.Stop()
		cload.Stop()
		if log := lc.LogTail(step.node, 100000); !strings.Contains(log, "set aside") {
			t.Errorf("%s's log does not name the set-aside replicas:\n%s", step.node, log)
		}
	}
	waitReplicasAgree(t, bin, cluster, 3, 60*time.Second)
	verifyPulls(t, cl, rl, "emb")
	verifyPulls(t, cl, chl, "chn")
	for _, id := range []string{"n1", "n2", "n3"} {
		if _, alive := lc.PID(id); !alive {
			t.Errorf("%s is not running", id)
		}
	}
}

func mustNode(t *testing.T, c *localcluster.Cluster, id string) localcluster.Node {
	t.Helper()
	nd, err := c.Node(id)
	if err != nil {
		t.Fatal(err)
	}
	return nd
}
