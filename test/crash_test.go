package test

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/raftps/raftps/shard/client"
)

// crashRounds is how many times TestCrashKillDuringWrites kills a node:
// RAFTPS_CRASH_ROUNDS (make crash sets it high), else 4.
func crashRounds(t *testing.T) int {
	if s := os.Getenv("RAFTPS_CRASH_ROUNDS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("RAFTPS_CRASH_ROUNDS=%q: want a positive number", s)
		}
		return n
	}
	return 4
}

// crashServerArgs: the log the crash test runs on, RAFTPS_CRASH_LOG=bolt
// for a raft.db per replica, shared for the node's shared log, else (the
// default, segments) a segment log per replica.
func crashServerArgs(t *testing.T) []string {
	switch v := os.Getenv("RAFTPS_CRASH_LOG"); v {
	case "bolt", "files":
		return []string{fastTimeouts, "--seg-log=false"}
	case "shared":
		return []string{fastTimeouts, "--shared-log"}
	case "", "segments":
		return []string{fastTimeouts}
	default:
		t.Fatalf("RAFTPS_CRASH_LOG=%q: want segments, bolt or shared", v)
		return nil
	}
}

// crashGrads is the grad precision of the crash test's table:
// RAFTPS_CRASH_GRADS=bf16 logs its pushes as bfloat16 (the test's small
// integer gradients are exact in it, so the ledger holds either way), else
// fp32.
func crashGrads(t *testing.T) string {
	switch v := os.Getenv("RAFTPS_CRASH_GRADS"); v {
	case "", "fp32":
		return "fp32"
	case "bf16":
		return v
	default:
		t.Fatalf("RAFTPS_CRASH_GRADS=%q: want fp32 or bf16", v)
		return ""
	}
}

// TestCrashKillDuringWrites: three server processes with fsync on (each
// shard replica's log in its segment files, or as RAFTPS_CRASH_LOG says), clients pushing without pause,
// and, round after round, a random node killed with SIGKILL at a random
// moment and restarted. Every round waits until the cluster acknowledges
// pushes again. At the end every acknowledged push is in the rows exactly
// once (no loss, no double apply through the retries the kills cause), and
// the replicas of every shard agree (checksums at one applied index).
func TestCrashKillDuringWrites(t *testing.T) {
	waitsMostly(t)
	rounds := crashRounds(t)
	bin, dir, cluster := binaryCluster(t, crashServerArgs(t)...)
	raftps := func(args ...string) string { t.Helper(); return runRaftps(t, bin, args...) }
	spec := client.TableSpec{Name: "crash", Dim: 2, Shards: 8, Optimizer: "sgd:lr=1", Initializer: "zeros"}
	t.Log(raftps("table", "create", spec.Name, "--dim", "2", "--shards", "8", "--optimizer", "sgd:lr=1", "--init", "zeros", "--grad-precision", crashGrads(t), "--cluster", cluster))
	l := newLedger(t, spec)
	newClient := elasticClient(t, cluster)
	load := startClientLoad(t, newClient, l, spec.Name, 4)
	defer load.Stop()
	waitAcked(t, l, 0, 50, time.Minute, "before the first kill")
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 23))
	for r := range rounds {
		victim := fmt.Sprintf("n%d", 1+rng.IntN(3))
		// A random point in the write stream: anywhere in the appends,
		// commits and fsyncs of the node's groups.
		time.Sleep(time.Duration(rng.IntN(400)) * time.Millisecond)
		raftps("cluster", "kill", victim, "--dir", dir)
		acked := l.acked.Load()
		time.Sleep(time.Duration(rng.IntN(300)) * time.Millisecond)
		raftps("cluster", "restart", victim, "--dir", dir)
		waitAcked(t, l, acked, 20, time.Minute, fmt.Sprintf("round %d, after %s was killed and restarted", r+1, victim))
	}
	load.Stop()
	cl := newClient()
	defer cl.Close()
	verifyPulls(t, cl, l, spec.Name)
	checksumsAgree(t, cl, spec.Name, time.Minute)
}
