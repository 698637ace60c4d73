package replication

import (
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

type nopFSM struct{}

func (nopFSM) Apply(*raft.Log) any                 { return nil }
func (nopFSM) Snapshot() (raft.FSMSnapshot, error) { return nil, errors.New("no snapshots") }
func (nopFSM) Restore(io.ReadCloser) error         { return nil }

// TestAwaitRaftShutdown: VerifyLeader and LeadershipTransfer called after
// raft has shut down sometimes return a future that is never answered (it
// went into raft's buffered channel, which nobody reads any more): the test
// checks that it saw such a future, and that Await returns
// ErrRaftShutdown for every call at once instead of waiting for ever.
func TestAwaitRaftShutdown(t *testing.T) {
	cfg := raft.DefaultConfig()
	cfg.LocalID = "a"
	cfg.HeartbeatTimeout, cfg.ElectionTimeout, cfg.LeaderLeaseTimeout = 50*time.Millisecond, 50*time.Millisecond, 50*time.Millisecond
	cfg.LogOutput = io.Discard
	_, tr := raft.NewInmemTransport("a")
	store := raft.NewInmemStore()
	r, err := raft.NewRaft(cfg, nopFSM{}, store, store, raft.NewInmemSnapshotStore(), tr)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.BootstrapCluster(raft.Configuration{Servers: []raft.Server{{ID: "a", Address: tr.LocalAddr()}}}).Error(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); r.State() != raft.Leader; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no leader")
		}
	}
	if err := Await(r, r.VerifyLeader()); err != nil {
		t.Fatalf("verifying a running leader: %v", err)
	}
	if err := r.Shutdown().Error(); err != nil {
		t.Fatal(err)
	}
	queued := 0
	for i := range 40 {
		f := r.VerifyLeader()
		if i%2 == 1 {
			f = r.LeadershipTransfer()
		}
		if fmt.Sprintf("%T", f) != "raft.errorFuture" {
			queued++ // a future nobody will answer
		}
		start := time.Now()
		if err := Await(r, f); !errors.Is(err, raft.ErrRaftShutdown) {
			t.Fatalf("call %d after shutdown: %v, want ErrRaftShutdown", i, err)
		}
		if d := time.Since(start); d > time.Second {
			t.Fatalf("call %d after shutdown: Await took %s", i, d)
		}
	}
	t.Logf("%d of 40 calls after shutdown queued a future raft never answers", queued)
	if queued == 0 {
		t.Error("no call queued a future after shutdown: the race this guards against did not happen (has raft changed?)")
	}
}
