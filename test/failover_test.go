package test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/raftps/raftps/shard/client"
)

// TestBinaryPausedLeaderNoAttemptTimeout: a leader that stops answering
// without closing its connections (SIGSTOP here; a dead machine or a
// partition alike) costs a client with the default 10 s attempt timeout
// neither that timeout nor a lost or doubled push. Its peers stop hearing
// from it, elect a new leader at once (expedited election), and tell the
// client it is silent (PeerContact), so the push goes to the new leader.
// Without either the push would take at least the attempt timeout.
func TestBinaryPausedLeaderNoAttemptTimeout(t *testing.T) {
	t.Parallel() // mostly waits; beside TestBinaryChaosLocal
	_, dir, addrs := binaryCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cl, err := client.New(testClientConfig(t, addrs))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := cl.Tables().Create(ctx, client.TableSpec{Name: "p", Dim: 2, Shards: 2, Optimizer: "sgd:lr=1", Initializer: "zeros"}); err != nil {
		t.Fatal(err)
	}
	keys := []uint64{1, 2, 3, 4, 5, 6, 7, 8}
	grads := make([]float32, 2*len(keys))
	for i := range grads {
		grads[i] = -1 // sgd lr 1: every push adds 1 to every value
	}
	if err := cl.Push(ctx, "p", keys, grads); err != nil {
		t.Fatal(err)
	}

	// Pause the node that leads shard 0.
	var leader string
	for deadline := time.Now().Add(10 * time.Second); leader == ""; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no leader of p/0 in any node's status")
		}
		for _, a := range strings.Split(addrs, ",") {
			st, err := cl.Admin().NodeStatus(ctx, a, false)
			if err != nil {
				continue
			}
			for _, r := range st.Replicas {
				if r.Table == "p" && r.Shard == 0 && r.State == "leader" {
					leader = st.NodeID
				}
			}
		}
	}
	b, err := os.ReadFile(filepath.Join(dir, leader, "pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			syscall.Kill(pid, syscall.SIGCONT)
		}
	}
	defer resume()

	start := time.Now()
	if err := cl.Push(ctx, "p", keys, grads); err != nil {
		t.Fatalf("push with the leader of p/0 paused: %v", err)
	}
	took := time.Since(start)
	t.Logf("leader %s of p/0 paused; push acknowledged after %s", leader, took.Round(time.Millisecond))
	if took >= 5*time.Second {
		t.Errorf("push took %s with the leader paused: the client waited for its attempt timeout (10 s) instead of learning from the other nodes that the leader is silent", took.Round(time.Millisecond))
	}
	resume()

	// Both pushes applied exactly once, seen through the new leaders.
	out := make([]float32, 2*len(keys))
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		err := cl.Pull(ctx, "p", keys, out)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
	}
	for i, v := range out {
		if v != 2 {
			t.Fatalf("value %d of the pulled rows = %v after two acknowledged pushes of +1: a push was lost or doubled", i, v)
		}
	}
}
