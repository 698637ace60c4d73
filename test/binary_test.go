package test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
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
	"github.com/raftps/raftps/trainer"
)

// buildBinary builds cmd/raftps into a temp dir.
func buildBinary(t testing.TB) string {
	t.Helper()
	return buildBinaryTags(t, "")
}

// buildBinaryTags builds cmd/raftps with build tags (comma-separated; ""
// for none) into a temp dir. Every binary of the tests is a test build
// (raftps_faultinject): its nodes serve /debug/netfault when started with
// --fault-injection, which a production build refuses.
func buildBinaryTags(t testing.TB, tags string) string {
	t.Helper()
	if raceDetector {
		// The race detector watches this process, which only drives the
		// binary's processes; make test-unit runs these tests.
		t.Skip("drives the real binary, which is not built with -race: run without -race")
	}
	bin := filepath.Join(t.TempDir(), "raftps")
	tags = strings.Trim(tags+","+faultInjectTag, ",")
	cmd := exec.Command("go", "build", "-tags", tags, "-o", bin, "github.com/raftps/raftps/cmd/raftps")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building raftps: %v\n%s", err, out)
	}
	return bin
}

// faultInjectTag is the build tag of binaries that may serve
// /debug/netfault (shard/netfault_http_on.go).
const faultInjectTag = "raftps_faultinject"

// fastTimeouts are server flags for a quick failover in tests.
const fastTimeouts = "--heartbeat-timeout 150ms --election-timeout 150ms --leader-lease-timeout 100ms"

// unsafeNoFsync is the server flag for the binary tests whose subject is
// training, not durability: see TrainRaft. Killed trainers and servers
// lose nothing by it, as the machine stays up.
const unsafeNoFsync = "--unsafe-no-fsync"

// serverArgsOf is cluster up's --server-args for serverArgs. The servers
// run detached, so they would outlive a test binary that dies without its
// cleanups (go test's -timeout panic): they stop with it.
func serverArgsOf(serverArgs []string) string {
	return strings.Join(append(slices.Clone(serverArgs), "--stop-with-pid", fmt.Sprint(os.Getpid())), " ")
}

// binaryCluster builds the binary and starts a 3-node cluster of it, its
// servers run with serverArgs, taken down when the test ends. It returns
// the binary, the cluster's directory and its gRPC addresses.
func binaryCluster(t testing.TB, serverArgs ...string) (bin, dir, addrs string) {
	t.Helper()
	return binaryClusterEnv(t, nil, serverArgs...)
}

// binaryClusterEnv is binaryCluster with extra environment variables for
// the servers.
func binaryClusterEnv(t testing.TB, env []string, serverArgs ...string) (bin, dir, addrs string) {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	return binaryClusterBuilt(t, buildBinary(t), env, serverArgs...)
}

// binaryClusterBuilt is binaryClusterEnv with a binary built already.
func binaryClusterBuilt(t testing.TB, bin string, env []string, serverArgs ...string) (_, dir, addrs string) {
	t.Helper()
	dir = filepath.Join(t.TempDir(), "cluster")
	base := freePortRun(t, 3)
	up := exec.Command(bin, "cluster", "up", "--nodes", "3", "--dir", dir, "--base-port", fmt.Sprint(base), "--ca-dir", testCA(t), "--server-args", serverArgsOf(serverArgs))
	up.Env = append(os.Environ(), env...)
	if out, err := up.CombinedOutput(); err != nil {
		t.Fatalf("raftps cluster up: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command(bin, "cluster", "down", "--dir", dir).CombinedOutput(); err != nil {
			t.Logf("cluster down: %v\n%s", err, out)
		}
	})
	b, err := os.ReadFile(filepath.Join(dir, "addrs"))
	if err != nil {
		t.Fatal(err)
	}
	return bin, dir, strings.TrimSpace(string(b))
}

// runRaftps runs the binary and returns its stdout; it fails the test, with
// stderr, if the command fails.
func runRaftps(t testing.TB, bin string, args ...string) string {
	t.Helper()
	out, err := exec.Command(bin, args...).Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("raftps %s: %v\n%s%s", strings.Join(args, " "), err, out, stderr)
	}
	return string(out)
}

// freePortRun finds a base port with n consecutive free client ports and
// their HTTP (base+100...), gossip (base+1000...) and peer (base+2000...)
// ports. The servers bind them only later, so the run lies below the
// kernel's ephemeral range, where no outgoing connection (of an in-process
// cluster in a parallel test) can take one meanwhile, and no two tests of
// this binary get overlapping runs.
func freePortRun(t testing.TB, n int) int {
	t.Helper()
	const lowest = 10000
	top := ephemeralLow() - runOffsets[len(runOffsets)-1] - runSpan // a run's last peer port stays below it
	if n > runSpan || top <= lowest {
		t.Fatalf("no room for a run of %d nodes below the ephemeral ports (%d)", n, ephemeralLow())
	}
	portRunsMu.Lock()
	defer portRunsMu.Unlock()
	for try := 0; try < 50; try++ {
		base := lowest + rand.IntN(top-lowest)
		ok := !slices.ContainsFunc(portRuns, func(b int) bool { return overlapping(base, b) })
		for i := 0; i < n && ok; i++ {
			for _, off := range runOffsets {
				p := base + off + i
				l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
				if err != nil {
					ok = false
					break
				}
				l.Close()
			}
		}
		if ok {
			portRuns = append(portRuns, base)
			// Cleanups run last-registered first, so the run is handed back
			// only after the caller's own cleanup (cluster down) has freed
			// its ports. Without this, a binary of 35 cluster tests runs out
			// of room below the ephemeral range.
			t.Cleanup(func() {
				portRunsMu.Lock()
				defer portRunsMu.Unlock()
				if i := slices.Index(portRuns, base); i >= 0 {
					portRuns = slices.Delete(portRuns, i, i+1)
				}
			})
			return base
		}
	}
	t.Fatalf("no free port range after 50 tries (%d runs held)", len(portRuns))
	return 0
}

// portRuns are the bases freePortRun handed out in this test binary.
var (
	portRunsMu sync.Mutex
	portRuns   []int
)

// runSpan is how many nodes a port run has room for: cluster add takes the
// next port of its run.
const runSpan = 100

// runOffsets are a node's ports from its client port: client, HTTP, gossip
// and peer (localcluster's layout).
var runOffsets = []int{0, 100, 1000, 2000}

// overlapping says whether the runs at bases a and b share a port at any of
// their offsets.
func overlapping(a, b int) bool {
	for _, oa := range runOffsets {
		for _, ob := range runOffsets {
			if d := (a + oa) - (b + ob); d > -runSpan && d < runSpan {
				return true
			}
		}
	}
	return false
}

// ephemeralLow is the first port of the kernel's ephemeral range (Linux;
// 32768, its default, elsewhere).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	var lo, hi int
	if _, err := fmt.Sscan(string(b), &lo, &hi); err != nil || lo < 1024 {
		return 32768
	}
	return lo
}

// TestBinaryClusterFailover drives the real binary as a user would: cluster
// up, table create, pushes, SIGKILL of the leader's process, more pushes,
// then checks that no acknowledged push was lost and takes the cluster down.
func TestBinaryClusterFailover(t *testing.T) {
	waitsMostly(t)
	bin, dir, cluster := binaryCluster(t, fastTimeouts)
	raftps := func(args ...string) string { t.Helper(); return runRaftps(t, bin, args...) }
	raftps("table", "create", "emb", "--dim", "2", "--shards", "4", "--optimizer", "sgd:lr=1", "--init", "zeros", "--cluster", cluster)
	// A chain table beside it: pushed to before and after the kill too.
	if got := raftps("table", "create", "chn", "--dim", "2", "--shards", "2", "--replication", "chain", "--optimizer", "sgd:lr=1", "--init", "zeros", "--cluster", cluster); !strings.Contains(got, "(chain)") {
		t.Errorf("table create --replication chain printed %q", got)
	}
	if got := raftps("table", "describe", "chn", "--cluster", cluster); !strings.Contains(got, "CHAIN (head → tail)") || !strings.Contains(got, " → ") {
		t.Errorf("table describe of a chain table printed no chain order:\n%s", got)
	}

	var desc client.TableInfo
	if err := json.Unmarshal([]byte(raftps("table", "describe", "emb", "--json", "--cluster", cluster)), &desc); err != nil {
		t.Fatal(err)
	}
	victim := desc.Shards[0].LeaderID
	if victim == "" {
		t.Fatalf("shard 0 has no leader: %+v", desc)
	}

	cfg := testClientConfig(t, cluster)
	cfg.RetryTimeout = 20 * time.Second
	cl, err := client.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx := context.Background()
	want := map[uint64]float32{}
	push := func(n int) {
		for i := range n {
			k := uint64(i % 40)
			if err := cl.Push(ctx, "emb", []uint64{k}, []float32{-1, -2}); err != nil {
				t.Fatal(err)
			}
			want[k]++
		}
	}
	chainWant := map[uint64]float32{}
	pushChain := func(n int) {
		for i := range n {
			k := uint64(i % 10)
			if err := cl.Push(ctx, "chn", []uint64{k}, []float32{-1, -2}); err != nil {
				t.Fatal(err)
			}
			chainWant[k]++
		}
	}
	push(200)
	pushChain(50)
	if st := raftps("status", "--cluster", cluster); !strings.Contains(st, "CHAIN\tEPOCH") && !strings.Contains(st, "chain head") {
		t.Errorf("status shows no chain replicas:\n%s", st)
	}
	raftps("cluster", "kill", victim, "--dir", dir)
	push(200)
	chainStart := time.Now()
	pushChain(50) // waits until the meta group drops the killed member from the chains
	t.Logf("chain table: 50 pushes after the kill took %s (gossip declares the node dead, the meta group drops it from the chains)", time.Since(chainStart).Round(time.Millisecond))
	for k, w := range chainWant {
		out := make([]float32, 2)
		if err := cl.Pull(ctx, "chn", []uint64{k}, out); err != nil {
			t.Fatal(err)
		}
		if out[0] != w || out[1] != 2*w {
			t.Fatalf("chain table key %d = %v, %d acknowledged pushes of (1, 2)", k, out, int(w))
		}
	}
	st := raftps("status", "--cluster", cluster)
	if !strings.Contains(st, "unreachable") {
		t.Errorf("status does not show the killed node as unreachable:\n%s", st)
	}
	keys := make([]uint64, 0, len(want))
	for k := range want {
		keys = append(keys, k)
	}
	out := make([]float32, 2*len(keys))
	if err := cl.Pull(ctx, "emb", keys, out); err != nil {
		t.Fatal(err)
	}
	for i, k := range keys {
		if out[2*i] != want[k] || out[2*i+1] != 2*want[k] {
			t.Fatalf("key %d = %v, %d acknowledged pushes of (1, 2)", k, out[2*i:2*i+2], int(want[k]))
		}
	}
	// The CLI reads the same rows.
	if got := raftps("pull", "emb", "0", "--cluster", cluster); !strings.HasPrefix(got, fmt.Sprintf("0: %g %g", want[0], 2*want[0])) {
		t.Fatalf("raftps pull printed %q", got)
	}
	raftps("cluster", "restart", victim, "--dir", dir)
}

// TestBinaryTrainProcesses: raftps train --trainers 2 runs two trainer
// processes that average their dense gradients by allreduce; the job exits
// 0 once both are done (the parent waits for its child), prints the --json
// summary, and the model beats chance by far.
func TestBinaryTrainProcesses(t *testing.T) {
	bin, _, addrs := binaryCluster(t)
	cmd := exec.Command(bin, "train", "--trainers", "2", "--steps", "300", "--json", "--quiet", "--cluster", addrs)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("raftps train: %v\n%s", err, stderr.String())
	}
	var res trainer.Summary
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("--json output %q: %v", out, err)
	}
	t.Logf("2 trainers, %d steps each: AUC %.4f (Bayes %.4f)", res.Steps, res.FinalAUC, res.BayesAUC)
	if res.Steps != 300 || res.FinalAUC < 0.7 {
		t.Fatalf("trained %d steps to AUC %.4f; want 300 steps and AUC above 0.7", res.Steps, res.FinalAUC)
	}
}

// TestBinaryTrainChildrenDieWithParent: the trainer processes that raftps
// train --trainers N starts end with it when it is killed. Here the
// cluster address has no server, so before the fix an orphaned trainer
// retried for its client's whole retry time (30 s) instead.
func TestBinaryTrainChildrenDieWithParent(t *testing.T) {
	waitsMostly(t)
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildBinary(t)
	nobody := fmt.Sprintf("127.0.0.1:%d", freePortRun(t, 1)) // nothing listens there
	parent := exec.Command(bin, "train", "--cluster", nobody, "--trainers", "2", "--model", "lr", "--quiet")
	// A file, not a pipe: the child inherits it, and Wait would wait for
	// every writer of a pipe to close it, the orphan included.
	log, err := os.Create(filepath.Join(t.TempDir(), "train.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	parent.Stderr = log
	out := func() string { b, _ := os.ReadFile(log.Name()); return string(b) }
	if err := parent.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = parent.Process.Kill(); _ = parent.Wait() }()
	var child int
	for deadline := time.Now().Add(10 * time.Second); child == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("raftps train --trainers 2 started no child process in 10s\n%s", out())
		}
		child = childOf(parent.Process.Pid)
	}
	defer func() { _ = syscall.Kill(child, syscall.SIGKILL) }()
	if err := parent.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = parent.Wait()
	for deadline := time.Now().Add(5 * time.Second); running(child); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("trainer %d still runs 5s after raftps train was killed\n%s", child, out())
		}
	}
}

// childOf returns the PID of a child process of pid, 0 if it has none.
func childOf(pid int) int {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, f := range stats {
		var self, ppid int
		if b, err := os.ReadFile(f); err == nil && procStat(b, &self, nil, &ppid) && ppid == pid {
			return self
		}
	}
	return 0
}

// running says whether process pid exists and has not exited: a zombie
// (exited, not yet reaped by whoever adopted it) counts as exited.
func running(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	var state byte
	return err == nil && procStat(b, nil, &state, nil) && state != 'Z' && state != 'X'
}

// procStat parses the PID, state and parent PID out of a /proc/PID/stat
// line, "pid (comm) state ppid ...", where comm may hold spaces and parens.
func procStat(b []byte, pid *int, state *byte, ppid *int) bool {
	s := string(b)
	open, shut := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || shut < open {
		return false
	}
	var p, pp int
	var st byte
	if _, err := fmt.Sscanf(s[:open], "%d", &p); err != nil {
		return false
	}
	if _, err := fmt.Sscanf(s[shut+1:], " %c %d", &st, &pp); err != nil {
		return false
	}
	if pid != nil {
		*pid = p
	}
	if state != nil {
		*state = st
	}
	if ppid != nil {
		*ppid = pp
	}
	return true
}

// TestBinaryServerStopsWithPID: a server given --stop-with-pid shuts down
// cleanly (exit 0) once that process exits, so the nodes a test binary
// started do not outlive it; a PID with no process is refused at start.
func TestBinaryServerStopsWithPID(t *testing.T) {
	waitsMostly(t)
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildBinary(t)
	base := freePortRun(t, 1)
	watched := exec.Command("sleep", "600")
	if err := watched.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = watched.Process.Kill() }()
	server := func(dir string, pid int) *exec.Cmd {
		return exec.Command(bin, "server", "--id", "n1", "--addr", fmt.Sprintf("127.0.0.1:%d", base), "--data-dir", dir, "--bootstrap", "--insecure",
			"--stop-with-pid", fmt.Sprint(pid))
	}
	srv := server(t.TempDir(), watched.Process.Pid)
	var out strings.Builder
	srv.Stderr = &out
	stdout, err := srv.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = srv.Process.Kill() }()
	if line, err := bufio.NewReader(stdout).ReadString('\n'); err != nil || !strings.Contains(line, "serving clients on") {
		t.Fatalf("server's first line %q (%v)\n%s", line, err, out.String())
	}
	exit := make(chan error, 1)
	go func() { exit <- srv.Wait() }()
	select {
	case err := <-exit:
		t.Fatalf("server exited while the watched process runs: %v\n%s", err, out.String())
	case <-time.After(500 * time.Millisecond):
	}
	// Killed but not yet reaped: a zombie must count as exited.
	if err := watched.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exit:
		if err != nil {
			t.Fatalf("server: %v, want exit 0\n%s", err, out.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("server still runs 15s after the watched process died\n%s", out.String())
	}
	if !strings.Contains(out.String(), "the process of --stop-with-pid exited") {
		t.Errorf("the server's log does not say why it stopped:\n%s", out.String())
	}
	_ = watched.Wait()

	// The watched process is reaped now: its PID names no process.
	b, err := server(t.TempDir(), watched.Process.Pid).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(string(b), "no process") {
		t.Fatalf("server with a dead --stop-with-pid: %v\n%s; want exit 1 saying there is no such process", err, b)
	}
}
