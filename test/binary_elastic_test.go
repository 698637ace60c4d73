package test

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/raftps/raftps/shard/client"
	"github.com/raftps/raftps/test/localcluster"
)

// The elastic cluster driven through the real binary: raftps cluster up,
// cluster kill and cluster add, node drain and node remove, and status
// --json, with pushes from this process checked against a ledger.

// elasticServerArgs: fast Raft and gossip, and a repair grace short enough
// for a test.
var elasticServerArgs = []string{fastTimeouts,
	"--gossip-probe-interval 200ms --gossip-probe-timeout 100ms --gossip-interval 50ms --gossip-suspicion-mult 4 --gossip-rejoin-interval 300ms",
	"--repair-grace", elasticGrace.String()}

// binaryClusterN is binaryCluster with n nodes, and port room for spare
// more added later (cluster add).
func binaryClusterN(t *testing.T, n, spare int, serverArgs ...string) (bin, dir, addrs string) {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin = buildBinary(t)
	dir = filepath.Join(t.TempDir(), "cluster")
	return bin, dir, binaryClusterAt(t, bin, dir, n, spare, serverArgs...)
}

// binaryClusterAt is binaryClusterN with the binary built and the
// cluster's directory chosen (it may hold a node's data dir, mounted
// already); it returns the cluster's addresses.
func binaryClusterAt(t *testing.T, bin, dir string, n, spare int, serverArgs ...string) string {
	t.Helper()
	base := freePortRun(t, n+spare)
	runRaftps(t, bin, "cluster", "up", "--nodes", fmt.Sprint(n), "--dir", dir, "--base-port", fmt.Sprint(base), "--ca-dir", testCA(t), "--server-args", serverArgsOf(serverArgs))
	t.Cleanup(func() {
		if t.Failed() {
			dumpStacks(t, dir, n+spare)
		}
		if out, err := exec.Command(bin, "cluster", "down", "--dir", dir).CombinedOutput(); err != nil {
			t.Logf("cluster down: %v\n%s", err, out)
		}
		if t.Failed() {
			for i := 1; i <= n+spare; i++ {
				if b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("n%d", i), "log")); err == nil {
					lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
					logged, dump := lines, []string(nil)
					if j := slices.Index(lines, "SIGQUIT: quit"); j >= 0 {
						logged, dump = lines[:j], lines[j:]
					}
					t.Logf("n%d log tail:\n%s", i, strings.Join(logged[max(0, len(logged)-15):], "\n"))
					if dump != nil {
						t.Logf("n%d goroutines in raftps code when the test failed:\n%s", i, raftpsStacks(dump, 12, 24))
					}
				}
			}
		}
	})
	return clusterAddrs(t, dir)
}

// dumpStacks makes every node of the cluster in dir that still runs print
// its goroutines into its log (SIGQUIT, which also ends it), so a test that
// failed on a hung node says where it hung (raftpsStacks picks them out).
// It notes the nodes that do not run at all.
func dumpStacks(t *testing.T, dir string, n int) {
	t.Helper()
	lc, err := localcluster.Load(dir)
	if err != nil {
		return
	}
	for i := 1; i <= n; i++ {
		id := fmt.Sprintf("n%d", i)
		pid, alive := lc.PID(id)
		if !alive {
			t.Logf("%s is not running (pid file: %d)", id, pid)
			continue
		}
		_ = syscall.Kill(pid, syscall.SIGQUIT)
		for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if _, alive := lc.PID(id); !alive {
				break
			}
		}
	}
}

// raftpsStacks returns, of a goroutine dump, at most n goroutines whose
// stacks run raftps code, each cut to its first lines.
func raftpsStacks(dump []string, n, lines int) string {
	var out []string
	for i := 0; i < len(dump) && n > 0; {
		j := i
		for j < len(dump) && dump[j] != "" {
			j++
		}
		g := dump[i:j]
		if len(g) > 0 && strings.HasPrefix(g[0], "goroutine ") && slices.ContainsFunc(g, func(l string) bool { return strings.Contains(l, "raftps/raftps/") }) {
			out = append(out, strings.Join(g[:min(len(g), lines)], "\n"))
			n--
		}
		i = j + 1
	}
	return strings.Join(out, "\n\n")
}

func clusterAddrs(t *testing.T, dir string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "addrs"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// statusNode returns the named node's entry of raftps status --json; ok false
// if status lists none.
func statusNode(s *client.ClusterStatus, id string) (replicas, leaders int, admin string, ok bool) {
	n, ok := s.Node(id)
	return n.Replicas, n.Leaders, n.Admin, ok
}

// describe is a status in one line, for the log.
func describe(s *client.ClusterStatus) string {
	var b strings.Builder
	fmt.Fprintf(&b, "map v%d, under-replicated %d, moving %d;", s.MapVersion, s.UnderReplicated, len(s.Moving))
	for _, n := range s.Nodes {
		fmt.Fprintf(&b, " %s(%s,%s):%dr/%dl", n.ID, n.State, n.Admin, n.Replicas, n.Leaders)
	}
	return b.String()
}

// statusJSON runs raftps status --json; a failed run is an error, not fatal,
// so that polls ride over it.
func statusJSON(bin, cluster string) (*client.ClusterStatus, error) {
	out, err := exec.Command(bin, "status", "--json", "--timeout", "2s", "--cluster", cluster).Output()
	if err != nil {
		return nil, fmt.Errorf("raftps status: %v", err)
	}
	st := &client.ClusterStatus{}
	if err := json.Unmarshal(out, st); err != nil {
		return nil, fmt.Errorf("raftps status --json: %v: %s", err, out)
	}
	return st, nil
}

// waitCLIStatus polls raftps status --json until cond returns "" (done) or
// timeout passes; cond returns what it still waits for.
func waitCLIStatus(t *testing.T, bin, cluster string, timeout time.Duration, what string, cond func(*client.ClusterStatus) string) *client.ClusterStatus {
	t.Helper()
	start := time.Now()
	deadline := start.Add(timeout)
	var why string
	for {
		st, err := statusJSON(bin, cluster)
		if err == nil {
			if why = cond(st); why == "" {
				t.Logf("%s after %s: %s", what, time.Since(start).Round(100*time.Millisecond), describe(st))
				return st
			}
			why += " (" + describe(st) + ")"
		} else {
			why = err.Error()
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after %s: %s", what, timeout, why)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// raftpsFails runs the binary expecting it to fail, and returns its stderr.
func raftpsFails(t *testing.T, bin string, args ...string) string {
	t.Helper()
	cmd := exec.Command(bin, args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err == nil {
		t.Fatalf("raftps %s succeeded, want a failure:\n%s", strings.Join(args, " "), out)
	}
	return stderr.String()
}

// clientLoad pushes from clients made by newClient, recording every
// acknowledged push in l, until stopped. An error fails the test.
type clientLoad struct {
	stop chan struct{}
	wg   sync.WaitGroup
}

func startClientLoad(t *testing.T, newClient func() *client.Client, l *ledger, table string, clients int) *clientLoad {
	ld := &clientLoad{stop: make(chan struct{})}
	for w := range clients {
		cl := newClient()
		ld.wg.Go(func() {
			defer cl.Close()
			pushWorker(t, cl, l, table, w, 11, math.MaxInt, ld.stop)
		})
	}
	return ld
}

func (ld *clientLoad) Stop() {
	select {
	case <-ld.stop:
	default:
		close(ld.stop)
	}
	ld.wg.Wait()
}

// waitAcked waits until the ledger has n more acknowledged pushes than it
// had at from.
func waitAcked(t *testing.T, l *ledger, from, n int64, timeout time.Duration, what string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for l.acked.Load() < from+n {
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d pushes acknowledged in %s, want %d", what, l.acked.Load()-from, timeout, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// verifyPulls pulls every key the ledger has, linearizably, and checks it
// equals the sum of the acknowledged pushes.
func verifyPulls(t *testing.T, cl *client.Client, l *ledger, table string) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	keys := make([]uint64, 0, len(l.want))
	for k := range l.want {
		keys = append(keys, k)
	}
	out := make([]float32, len(keys)*l.dim)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cl.Pull(ctx, table, keys, out, client.WithConsistency(client.Linearizable)); err != nil {
		t.Fatal(err)
	}
	for i, k := range keys {
		for col := range l.dim {
			if out[i*l.dim+col] != l.want[k][col] {
				t.Fatalf("key %d column %d = %v, acknowledged pushes sum to %v (lost or doubled push)", k, col, out[i*l.dim+col], l.want[k][col])
			}
		}
	}
	t.Logf("%d acknowledged pushes, %d keys: every row is their exact sum", l.acked.Load(), len(keys))
}

func elasticClient(t *testing.T, cluster string) func() *client.Client {
	return func() *client.Client {
		cfg := testClientConfig(t, cluster)
		cfg.RetryTimeout = 30 * time.Second
		cl, err := client.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return cl
	}
}

// mostLeaders returns the node that leads the most shards.
func mostLeaders(st *client.ClusterStatus) string {
	best, n := "", 0
	for _, nd := range st.Nodes {
		if best == "" || nd.Leaders > n {
			best, n = nd.ID, nd.Leaders
		}
	}
	return best
}

// TestBinaryElasticRepairAndGrow: 5 server processes, a 16-shard 3-replica
// table under push load. SIGKILL one for good: after the repair grace the
// cluster places its replicas elsewhere (nothing under-replicated, the dead
// node holds none). Then cluster add starts a sixth node with --join, and
// the scheduler gives it its share of replicas and leaders. Every
// acknowledged push is in the rows at the end, once.
func TestBinaryElasticRepairAndGrow(t *testing.T) {
	bin, dir, cluster := binaryClusterN(t, 5, 1, elasticServerArgs...)
	raftps := func(args ...string) string { t.Helper(); return runRaftps(t, bin, args...) }
	raftps("table", "create", "el", "--dim", "2", "--shards", "16", "--replicas", "3", "--optimizer", "sgd:lr=1", "--init", "zeros", "--cluster", cluster)
	l := newLedger(t, client.TableSpec{Name: "el", Dim: 2, Shards: 16})
	st := waitCLIStatus(t, bin, cluster, 30*time.Second, "table placed and led", func(st *client.ClusterStatus) string {
		var replicas, leaders int
		for _, n := range st.Nodes {
			replicas += n.Replicas
			leaders += n.Leaders
		}
		if replicas != 48 || leaders != 16 || st.UnderReplicated != 0 {
			return fmt.Sprintf("%d replicas, %d leaders", replicas, leaders)
		}
		return ""
	})

	newClient := elasticClient(t, cluster)
	load := startClientLoad(t, newClient, l, "el", 3)
	defer load.Stop()
	waitAcked(t, l, 0, 200, 30*time.Second, "pushes before the kill")

	victim := mostLeaders(st)
	raftps("cluster", "kill", victim, "--dir", dir)
	killed := time.Now()
	before := l.acked.Load()
	waitCLIStatus(t, bin, cluster, elasticGrace+60*time.Second, "repaired without "+victim, func(st *client.ClusterStatus) string {
		r, _, _, _ := statusNode(st, victim)
		if st.UnderReplicated != 0 || r != 0 {
			return fmt.Sprintf("under-replicated %d, %s holds %d replicas", st.UnderReplicated, victim, r)
		}
		return ""
	})
	t.Logf("killed %s; repaired %s later; %d pushes acknowledged meanwhile", victim, time.Since(killed).Round(100*time.Millisecond), l.acked.Load()-before)
	waitAcked(t, l, before, 100, 30*time.Second, "pushes after the repair")

	// The cluster is 4 live nodes now; a sixth joins.
	out := raftps("cluster", "add", "--dir", dir)
	if !strings.Contains(out, "n6 joined") {
		t.Fatalf("cluster add printed %q, want n6 to join", out)
	}
	cluster = clusterAddrs(t, dir)
	added := time.Now()
	before = l.acked.Load()
	waitCLIStatus(t, bin, cluster, 60*time.Second, "n6 holds its share", func(st *client.ClusterStatus) string {
		r, lead, admin, ok := statusNode(st, "n6")
		if !ok || admin != "active" || r < 48/5 || lead < 16/5 {
			return fmt.Sprintf("n6 (%s) holds %d replicas and leads %d shards, want %d and %d", admin, r, lead, 48/5, 16/5)
		}
		return ""
	})
	t.Logf("n6 took its share in %s; %d pushes acknowledged meanwhile", time.Since(added).Round(100*time.Millisecond), l.acked.Load()-before)
	waitAcked(t, l, before, 100, 30*time.Second, "pushes after n6 joined")
	load.Stop()
	if t.Failed() {
		return
	}
	cl := newClient()
	defer cl.Close()
	verifyPulls(t, cl, l, "el")

	// The dead node can be removed now: it is not alive.
	if out := raftps("node", "remove", victim, "--cluster", cluster); !strings.Contains(out, victim+" is removed") {
		t.Fatalf("node remove %s printed %q", victim, out)
	}
}

// TestBinaryElasticDrain: on 4 nodes with a 3-replica table, removing an
// alive node is refused and changes nothing; draining one that would leave
// too few active nodes is refused; node drain --wait moves every replica
// and leadership off a node while pushes go on, and none is lost.
func TestBinaryElasticDrain(t *testing.T) {
	bin, _, cluster := binaryClusterN(t, 4, 0, elasticServerArgs...)
	raftps := func(args ...string) string { t.Helper(); return runRaftps(t, bin, args...) }
	raftps("table", "create", "el", "--dim", "2", "--shards", "8", "--replicas", "3", "--optimizer", "sgd:lr=1", "--init", "zeros", "--cluster", cluster)
	l := newLedger(t, client.TableSpec{Name: "el", Dim: 2, Shards: 8})
	settled := func(st *client.ClusterStatus) string {
		var replicas, leaders int
		for _, n := range st.Nodes {
			replicas += n.Replicas
			leaders += n.Leaders
		}
		if replicas != 24 || leaders != 8 || st.UnderReplicated != 0 || len(st.Moving) != 0 {
			return fmt.Sprintf("%d replicas, %d leaders", replicas, leaders)
		}
		return ""
	}
	before := waitCLIStatus(t, bin, cluster, 30*time.Second, "table placed and led", settled)
	victim := mostLeaders(before)
	r0, _, _, _ := statusNode(before, victim)

	// Removing an alive node is refused, with the way to do it.
	msg := raftpsFails(t, bin, "node", "remove", victim, "--cluster", cluster)
	for _, want := range []string{victim + " is alive", "raftps node drain " + victim} {
		if !strings.Contains(msg, want) {
			t.Errorf("node remove %s of an alive node: stderr %q does not say %q", victim, msg, want)
		}
	}
	st, err := statusJSON(bin, cluster)
	if err != nil {
		t.Fatal(err)
	}
	if r, _, admin, _ := statusNode(st, victim); admin != "active" || r != r0 {
		t.Fatalf("refused remove changed %s: admin %s, %d replicas (was active, %d)", victim, admin, r, r0)
	}

	newClient := elasticClient(t, cluster)
	load := startClientLoad(t, newClient, l, "el", 3)
	defer load.Stop()
	waitAcked(t, l, 0, 200, 30*time.Second, "pushes before the drain")

	start := time.Now()
	pushed := l.acked.Load()
	out := raftps("node", "drain", victim, "--wait", "--wait-timeout", "60s", "--cluster", cluster)
	if !strings.Contains(out, victim+" is drained") {
		t.Fatalf("node drain --wait printed %q", out)
	}
	t.Logf("drained %s in %s; %d pushes acknowledged meanwhile", victim, time.Since(start).Round(100*time.Millisecond), l.acked.Load()-pushed)
	st, err = statusJSON(bin, cluster)
	if err != nil {
		t.Fatal(err)
	}
	if r, lead, admin, _ := statusNode(st, victim); r != 0 || lead != 0 || admin != "draining" {
		t.Fatalf("after drain --wait, %s (%s) holds %d replicas and leads %d shards: %s", victim, admin, r, lead, describe(st))
	}
	if st.UnderReplicated != 0 {
		t.Fatalf("after the drain: %s", describe(st))
	}
	// Three active nodes are left for 3 replicas: draining another is refused.
	other := "n1"
	if victim == other {
		other = "n2"
	}
	if msg := raftpsFails(t, bin, "node", "drain", other, "--cluster", cluster); !strings.Contains(msg, "add a node first") {
		t.Errorf("draining a second node: stderr %q, want a refusal saying to add a node first", msg)
	}
	waitAcked(t, l, l.acked.Load(), 100, 30*time.Second, "pushes after the drain")
	load.Stop()
	if t.Failed() {
		return
	}
	cl := newClient()
	defer cl.Close()
	verifyPulls(t, cl, l, "el")
}
