package test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/raftps/raftps/shard/api"
	"github.com/raftps/raftps/shard/certs"
	"github.com/raftps/raftps/shard/client"
	"github.com/raftps/raftps/shard/shardpb"
	"github.com/raftps/raftps/test/localcluster"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// binaryClient is a client of the cluster at addrs (comma-separated).
func binaryClient(t *testing.T, addrs string) *client.Client {
	t.Helper()
	cfg := testClientConfig(t, addrs)
	cfg.RetryTimeout = 30 * time.Second
	cl, err := client.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	return cl
}

// replicaDirsOf lists, per node of the local cluster in dir, the replica
// directories of table (groups/TABLE/* and chains/TABLE/*) on disk.
func replicaDirsOf(dir, table string) []string {
	var out []string
	for _, kind := range []string{"groups", "chains"} {
		m, _ := filepath.Glob(filepath.Join(dir, "n*", "data", kind, table, "*"))
		out = append(out, m...)
	}
	return out
}

// waitNoReplicaDirs waits until no node of the cluster in dir has a replica
// directory of table.
func waitNoReplicaDirs(t *testing.T, dir, table string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		left := replicaDirsOf(dir, table)
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s, replica directories of dropped table %s remain: %v", timeout, table, left)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// checksumsAgree waits until every shard of table has all its replicas at
// one applied index with one checksum.
func checksumsAgree(t *testing.T, cl *client.Client, table string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		st, err := cl.Admin().ClusterStatus(context.Background(), client.StatusOptions{Checksums: true})
		bad := ""
		if err != nil {
			bad = err.Error()
		} else {
			type at struct {
				applied uint64
				sum     uint64
			}
			seen := map[string][]at{}
			for _, r := range st.Replicas {
				if r.Table != table {
					continue
				}
				if r.Checksum == nil {
					bad = fmt.Sprintf("%s on %s has no checksum", r.Group, r.Node)
					continue
				}
				seen[r.Group] = append(seen[r.Group], at{r.Applied, *r.Checksum})
			}
			if len(seen) == 0 {
				bad = "no replicas of " + table
			}
			for g, rs := range seen {
				if len(rs) < 2 || slices.ContainsFunc(rs, func(a at) bool { return a != rs[0] }) {
					bad = fmt.Sprintf("%s: replicas (applied, checksum) %v", g, rs)
				}
			}
		}
		if bad == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("replicas of %s do not agree after %s: %s", table, timeout, bad)
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// wantCode fails the test unless err is a status of code naming want.
func wantCode(t *testing.T, what string, err error, code codes.Code, want string) {
	t.Helper()
	if status.Code(err) != code || !strings.Contains(status.Convert(err).Message(), want) {
		t.Fatalf("%s: got %v, want %s naming %q", what, err, code, want)
	}
}

// wantRemote fails the test unless err wraps a node's answer of code whose
// message names want.
func wantRemote(t *testing.T, what string, err error, code codes.Code, want string) {
	t.Helper()
	var re *api.RemoteError
	if !errors.As(err, &re) || re.Code != code || !strings.Contains(re.Msg, want) {
		t.Fatalf("%s: got %v, want %s naming %q", what, err, code, want)
	}
}

// TestBinaryTableNamesQuotasAndDrop, on three server processes:
//   - the names (".", "..", "3", ".x", "a/b", 300 bytes) are refused
//     with InvalidArgument and make no directory;
//   - quotas hold at their boundary (tables, replicas per node, jobs) and a
//     refusal is ResourceExhausted naming the limit;
//   - a drop is refused while a job lists the table and allowed with force;
//     afterwards no node has a directory of it, the name is created again
//     empty, and the other table keeps every acknowledged push with equal
//     replica checksums;
//   - a node down during a drop deletes the dropped table's replicas when
//     it comes back.
func TestBinaryTableNamesQuotasAndDrop(t *testing.T) {
	bin, dir, addrs := binaryCluster(t, fastTimeouts, unsafeNoFsync, "--max-tables", "3", "--max-replicas-per-node", "9", "--max-jobs", "1")
	cl := binaryClient(t, addrs)
	ctx := context.Background()
	raw := shardpb.NewParameterServerClient(rawConn(t, strings.Split(addrs, ",")[0], testClientConfig(t, addrs).DialOptions))

	for _, name := range []string{".", "..", "3", ".x", "a/b", strings.Repeat("a", 300)} {
		_, err := raw.CreateTable(ctx, &shardpb.CreateTableRequest{Spec: &shardpb.TableSpec{Name: name, Dim: 2}})
		wantCode(t, fmt.Sprintf("create table %.20q", name), err, codes.InvalidArgument, "table name")
		if out, err := exec.Command(bin, "table", "create", name, "--dim", "2", "--cluster", addrs).CombinedOutput(); err == nil {
			t.Fatalf("raftps table create %.20q succeeded: %s", name, out)
		}
	}
	if m, _ := filepath.Glob(filepath.Join(dir, "n*", "data", "groups", "*")); len(m) != 0 {
		t.Fatalf("refused names made directories: %v", m)
	}

	// JoinCluster with a megabyte ID or address, as any peer could send it:
	// refused before anything is proposed (the metadata group keeps
	// committing: the creations below go through it).
	lc, err := localcluster.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	// As node n9 of the cluster's CA: a peer can only join as itself now,
	// so a malformed ID is refused by the peer gate (PermissionDenied), a
	// malformed address by the handler (InvalidArgument); both briefly.
	if _, err := certs.CreateNode(lc.CertsDir(), "n9", []string{"127.0.0.1"}, certs.Options{}); err != nil {
		t.Fatal(err)
	}
	cc, err := grpc.NewClient(lc.Nodes[0].PeerAddr, append(nodeCreds(t, lc, "n9"), grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(8<<20)))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	peer := shardpb.NewPeerClient(cc)
	huge := strings.Repeat("x", 1<<20)
	for _, nd := range []*shardpb.ClusterNode{
		{Id: huge, Addr: "127.0.0.1:1", PeerAddr: "127.0.0.1:2"},
		{Id: "n9", Addr: huge + ":1", PeerAddr: "127.0.0.1:2"},
		{Id: "../n9", Addr: "127.0.0.1:1", PeerAddr: "127.0.0.1:2"},
	} {
		_, err := peer.JoinCluster(ctx, &shardpb.JoinClusterRequest{Node: nd})
		if c := status.Code(err); (c != codes.InvalidArgument && c != codes.PermissionDenied) || len(status.Convert(err).Message()) > 1000 {
			t.Fatalf("JoinCluster of node %.20q at %.20q: %.300v, want a short InvalidArgument or PermissionDenied", nd.Id, nd.Addr, err)
		}
	}

	// Quotas: 3 nodes, 3 replicas per shard, so a table of S shards puts S
	// replicas on every node.
	for _, spec := range []client.TableSpec{{Name: "keep", Dim: 2, Shards: 4, Optimizer: "sgd:lr=1"}, {Name: "gone", Dim: 2, Shards: 4, Optimizer: "sgd:lr=1"}} {
		if _, err := cl.Tables().Create(ctx, spec); err != nil {
			t.Fatal(err)
		}
	}
	_, err = cl.Tables().Create(ctx, client.TableSpec{Name: "over", Dim: 2, Shards: 2})
	wantRemote(t, "10th replica per node", err, codes.ResourceExhausted, "limit of 9 replicas per node")
	if _, err := cl.Tables().Create(ctx, client.TableSpec{Name: "one", Dim: 2, Shards: 1}); err != nil {
		t.Fatalf("9th replica per node and 3rd table, both at their limit: %v", err)
	}
	_, err = cl.Tables().Create(ctx, client.TableSpec{Name: "four", Dim: 2, Shards: 1})
	wantRemote(t, "4th table", err, codes.ResourceExhausted, "limit of tables is 3")

	// Acknowledged pushes to both tables.
	keys := []uint64{1, 2, 3, 4, 5, 6, 7, 8}
	grads := make([]float32, 2*len(keys))
	for i := range grads {
		grads[i] = -1
	}
	for range 5 {
		for _, table := range []string{"keep", "gone"} {
			if err := cl.Push(ctx, table, keys, grads); err != nil {
				t.Fatal(err)
			}
		}
	}

	// A job that lists "gone"; the registry's limit is one job.
	if _, _, err := cl.Jobs().Join(ctx, "j1", 2, 0, "127.0.0.1:1", "gone"); err != nil {
		t.Fatal(err)
	}
	_, _, err = cl.Jobs().Join(ctx, "j2", 1, 0, "127.0.0.1:2")
	wantRemote(t, "second job under a limit of one", err, codes.ResourceExhausted, "limit of jobs is 1")
	err = cl.Tables().Drop(ctx, "gone", false)
	wantRemote(t, "drop of a table a job uses", err, codes.FailedPrecondition, `job "j1"`)
	if !errors.Is(err, client.ErrTableInUse) {
		t.Fatalf("drop of a table a job uses: %v, want ErrTableInUse", err)
	}
	if out, err := exec.Command(bin, "table", "drop", "gone", "--cluster", addrs).CombinedOutput(); err == nil || !strings.Contains(string(out), "--force") {
		t.Fatalf("raftps table drop of a table in use: %v: %s", err, out)
	}
	if len(replicaDirsOf(dir, "gone")) != 12 {
		t.Fatalf("a refused drop touched the replicas: %v", replicaDirsOf(dir, "gone"))
	}
	runRaftps(t, bin, "table", "drop", "gone", "--force", "--cluster", addrs)
	waitNoReplicaDirs(t, dir, "gone", 20*time.Second)
	if _, err := cl.Tables().Describe(ctx, "gone"); !errors.Is(err, client.ErrUnknownTable) {
		t.Fatalf("describe after the drop: %v", err)
	}

	// The name again: empty.
	if _, err := cl.Tables().Create(ctx, client.TableSpec{Name: "gone", Dim: 2, Shards: 4}); err != nil {
		t.Fatal(err)
	}
	out := make([]float32, 2*len(keys))
	if err := cl.Pull(ctx, "gone", keys, out); err != nil {
		t.Fatal(err)
	}
	if slices.ContainsFunc(out, func(v float32) bool { return v != 0 }) {
		t.Fatalf("re-created table holds the dropped one's rows: %v", out)
	}
	// The other table: every acknowledged push, on every replica alike.
	if err := cl.Pull(ctx, "keep", keys, out); err != nil {
		t.Fatal(err)
	}
	if slices.ContainsFunc(out, func(v float32) bool { return v != 5 }) {
		t.Fatalf("table keep lost pushes: %v, want all 5", out)
	}
	checksumsAgree(t, cl, "keep", 20*time.Second)

	// A node down during a drop cleans up when it comes back.
	runRaftps(t, bin, "cluster", "kill", "n3", "--dir", dir)
	runRaftps(t, bin, "table", "drop", "one", "--cluster", addrs)
	if left := replicaDirsOf(dir, "one"); len(left) != 1 || !strings.Contains(left[0], "/n3/") {
		t.Logf("while n3 is down: %v", left)
	}
	runRaftps(t, bin, "cluster", "restart", "n3", "--dir", dir)
	waitNoReplicaDirs(t, dir, "one", 30*time.Second)
	checksumsAgree(t, cl, "keep", 30*time.Second)
	if err := cl.Pull(ctx, "keep", keys, out); err != nil || slices.ContainsFunc(out, func(v float32) bool { return v != 5 }) {
		t.Fatalf("table keep after n3's restart: %v %v", out, err)
	}
}

// TestBinaryDataDirIdentity, on server processes: a node started with
// another --id than its data dir's refuses to start and says why; a data
// dir copied from another cluster is refused (the node exits, naming both
// clusters) before it opens a replica, and the cluster it tried to join
// keeps serving with every acknowledged push.
func TestBinaryDataDirIdentity(t *testing.T) {
	bin, dirA, addrsA := binaryCluster(t, fastTimeouts, unsafeNoFsync)
	ctx := context.Background()
	clA := binaryClient(t, addrsA)
	// Right after cluster up the metadata leader may not have heard by
	// gossip that the third node is alive yet, and refuses a 3-replica
	// table until it has.
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		_, err := clA.Tables().Create(ctx, client.TableSpec{Name: "emb", Dim: 2, Shards: 2, Optimizer: "sgd:lr=1"})
		if err == nil {
			break
		}
		if !strings.Contains(err.Error(), "live active nodes") || time.Now().After(deadline) {
			t.Fatal(err)
		}
	}
	if err := clA.Push(ctx, "emb", []uint64{1}, []float32{-1, -1}); err != nil {
		t.Fatal(err)
	}
	a, err := localcluster.Load(dirA)
	if err != nil {
		t.Fatal(err)
	}
	n1, err := a.Node("n1")
	if err != nil {
		t.Fatal(err)
	}
	runRaftps(t, bin, "cluster", "kill", "n1", "--dir", dirA)
	args := slices.Clone(n1.Args)
	args[slices.Index(args, "--id")+1] = "other"
	// No certificate names "other": without --insecure the server would
	// refuse for want of one before it looked at the data dir.
	if i := slices.Index(args, "--certs-dir"); i >= 0 {
		args = slices.Delete(args, i, i+2)
	}
	args = append(args, "--insecure")
	serverRefuses(t, bin, args, "belongs to node n1")
	runRaftps(t, bin, "cluster", "restart", "n1", "--dir", dirA)

	// Cluster B, same table name; its n3 gets a copy of A's n3 data dir.
	_, dirB, addrsB := binaryClusterBuilt(t, bin, nil, fastTimeouts, unsafeNoFsync)
	clB := binaryClient(t, addrsB)
	if _, err := clB.Tables().Create(ctx, client.TableSpec{Name: "emb", Dim: 2, Shards: 2, Optimizer: "sgd:lr=1"}); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := clB.Push(ctx, "emb", []uint64{1, 2}, []float32{-1, -1, -1, -1}); err != nil {
			t.Fatal(err)
		}
	}
	b, err := localcluster.Load(dirB)
	if err != nil {
		t.Fatal(err)
	}
	n3, err := b.Node("n3")
	if err != nil {
		t.Fatal(err)
	}
	runRaftps(t, bin, "cluster", "down", "--dir", dirA) // A's n3 must not answer for the copy
	runRaftps(t, bin, "cluster", "kill", "n3", "--dir", dirB)
	dataB := filepath.Join(dirB, "n3", "data")
	if err := os.RemoveAll(dataB); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("cp", "-a", filepath.Join(dirA, "n3", "data"), dataB).CombinedOutput(); err != nil {
		t.Fatalf("copying a data dir: %v %s", err, out)
	}
	serverRefuses(t, bin, n3.Args, "belongs to cluster")

	// B keeps serving on n1 and n2, with every acknowledged push.
	out := make([]float32, 4)
	if err := clB.Pull(ctx, "emb", []uint64{1, 2}, out); err != nil {
		t.Fatal(err)
	}
	if slices.ContainsFunc(out, func(v float32) bool { return v != 3 }) {
		t.Fatalf("cluster B's rows after the refused node: %v, want all 3", out)
	}
}

// serverRefuses runs raftps with args and wants it to exit non-zero within
// 60 s with want in its output.
func serverRefuses(t *testing.T, bin string, args []string, want string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	outB, err := cmd.CombinedOutput()
	out := string(outB)
	if ctx.Err() != nil {
		t.Fatalf("raftps %s kept running for 60s, want a refusal naming %q:\n%s", strings.Join(args, " "), want, tail(out, 20))
	}
	if err == nil || !strings.Contains(out, want) {
		t.Fatalf("raftps %s: %v, want a refusal naming %q:\n%s", strings.Join(args, " "), err, want, tail(out, 20))
	}
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
