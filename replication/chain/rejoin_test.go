package chain

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/raftps/raftps/replication"
)

// divergedRejoin builds the divergent chain of a removed and re-appended
// head: in epoch 1 the chain is 0 → 1 → 2 and key 3 holds a committed row;
// the head then appends leftover entries (three pushes to key 3, applied and
// persisted on the head only) and is closed; epoch 2 is 1 → 2, which commits
// chainEntries other pushes to key 3 (entries base+1.. of epoch 2, so with 3
// they take the leftovers' indexes). It returns the cluster, base (the index
// committed before the leftovers), and the committed and leftover rows of
// key 3. Node 0 is closed on return.
func divergedRejoin(t *testing.T, chainEntries int) (c *cluster, base uint64, committed, leftover []float32) {
	t.Helper()
	c = newCluster(t, 3, testConfig(2))
	ctx := context.Background()
	key := []uint64{3}
	if _, err := c.push(ctx, &replication.Push{Client: 1, Seq: 1, Keys: key, Grads: []float32{1, 1}}); err != nil {
		t.Fatal(err)
	}
	c.waitConverged(5 * time.Second)
	x := c.head()
	base = x.AppliedIndex()
	x.pauseForward.Store(true)
	for s := uint64(1); s <= 3; s++ {
		pctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		_, err := x.Push(pctx, &replication.Push{Client: 50, Seq: s, Keys: key, Grads: []float32{100, 100}})
		cancel()
		if !errors.Is(err, replication.ErrUnknownOutcome) {
			t.Fatalf("push with forwarding paused: %v, want replication.ErrUnknownOutcome", err)
		}
	}
	// A push whose context ran out while still queued is logged anyway
	// (its outcome is unknown, not failed): under -race on a busy machine
	// the last one may land after its caller gave up.
	waitFor(t, "the old head to apply its three unforwarded pushes", func() bool { return x.AppliedIndex() >= base+3 })
	if got := x.AppliedIndex(); got != base+3 {
		t.Fatalf("old head applied %d, want %d", got, base+3)
	}
	c.closeChain(0)
	c.reconfigure(1, 2) // epoch 2
	for s := range chainEntries {
		if _, err := c.push(ctx, &replication.Push{Client: 60, Seq: uint64(s) + 1, Keys: key, Grads: []float32{1, 1}}); err != nil {
			t.Fatal(err)
		}
	}
	c.waitConverged(5 * time.Second)
	v := -1 - float32(chainEntries)
	return c, base, []float32{v, v}, []float32{-301, -301}
}

// TestChainRejoinedTailWaitsForSync re-appends, at the tail, a head that was
// removed holding uncommitted entries, and holds back the snapshot its
// predecessor sends it: until that snapshot is installed (the handshake
// settled its log) it must not count its leftover entries as committed nor
// serve them to a linearizable read or to another member's CRAQ read. Its
// leftovers either take the same indexes as the chain's committed entries
// (other epoch) or reach past the chain's log.
func TestChainRejoinedTailWaitsForSync(t *testing.T) {
	for _, tc := range []struct {
		name         string
		chainEntries int
	}{
		{"same indexes, other epoch", 3},
		{"leftovers past the chain's log", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, base, committed, leftover := divergedRejoin(t, tc.chainEntries)
			ctx := context.Background()
			key := []uint64{3}
			x := c.open(0)
			release := holdSnapshots(t, x)
			c.reconfigure(1, 2, 0) // epoch 3: x is the tail again
			waitFor(t, "the predecessor's hello at the rejoined tail", func() bool {
				x.mu.Lock()
				defer x.mu.Unlock()
				return len(x.inbound) > 0
			})
			time.Sleep(20 * time.Millisecond) // a snapshot piece or two arrive meanwhile
			if got := x.CommittedIndex(); got > base {
				t.Errorf("rejoined tail counts index %d as committed before its handshake settled; only %d was committed in its log", got, base)
			}
			out := make([]float32, 2)
			ix, err := x.Pull(ctx, key, out, ReadLinearizable)
			if err == nil {
				t.Errorf("rejoined tail served a linearizable read before its handshake settled: %v at index %d (committed %v, its uncommitted leftover %v)", out, ix, committed, leftover)
			} else if !errors.Is(err, ErrNotReady) {
				t.Errorf("linearizable read at the rejoined tail: %v, want ErrNotReady", err)
			}
			ix, err = c.nodes[1].mux.tailRead(ctx, time.Second, c.nodes[0].addr, "t/0", 3, key, out)
			if err == nil {
				t.Errorf("rejoined tail answered a CRAQ read before its handshake settled: %v at index %d (committed %v, its uncommitted leftover %v)", out, ix, committed, leftover)
			} else if !errors.Is(err, ErrNotReady) {
				t.Errorf("CRAQ read at the rejoined tail: %v, want ErrNotReady", err)
			}
			release()
			waitFor(t, "the rejoined tail to serve reads", func() bool {
				_, err := x.Pull(ctx, key, out, ReadLinearizable)
				return err == nil
			})
			if !equalF32(out, committed) {
				t.Fatalf("rejoined tail read %v after its sync, want %v", out, committed)
			}
			c.waitConverged(5 * time.Second)
			x.applyMu.Lock()
			installs := x.installs
			x.applyMu.Unlock()
			if installs == 0 {
				t.Fatal("the diverged member was not given a snapshot")
			}
		})
	}
}

// TestChainRecoveredTailCommitsNothingBeforeSync configures a diverged old
// head as the tail while its predecessor is down, then restarts it: neither
// SetConfig nor recovery may count its leftover entries as committed, and
// once the chain is whole again its state is the chain's.
func TestChainRecoveredTailCommitsNothingBeforeSync(t *testing.T) {
	c, base, committed, _ := divergedRejoin(t, 1)
	x := c.open(0)
	c.closeChain(2) // x's predecessor-to-be says no hello
	c.reconfigure(1, 2, 0)
	if got := x.CommittedIndex(); got > base {
		t.Errorf("tail configured with no hello counts index %d as committed; only %d was committed in its log", got, base)
	}
	c.closeChain(0)
	x = c.open(0)
	if got := x.CommittedIndex(); got > base {
		t.Errorf("tail recovered before any hello counts index %d as committed; only %d was committed in its log", got, base)
	}
	if x.Role() != RoleTail {
		t.Fatalf("recovered role %s, want tail", x.Role())
	}
	c.open(2)
	c.reconfigure(1, 2, 0) // epoch 4, with node 2 back
	c.waitConverged(5 * time.Second)
	out := make([]float32, 2)
	if _, err := x.Pull(context.Background(), []uint64{3}, out, ReadLinearizable); err != nil || !equalF32(out, committed) {
		t.Fatalf("read at the tail: %v, %v; want %v", out, err, committed)
	}
}

// TestChainUnsyncedMemberFeedsNothing appends a new node behind a rejoined,
// diverged member whose handshake has not settled: the new node must get
// nothing from it (else, as the tail, it would commit and serve the
// leftovers), and once the rejoined member is synced both hold the chain's
// state.
func TestChainUnsyncedMemberFeedsNothing(t *testing.T) {
	c, _, committed, leftover := divergedRejoin(t, 3)
	ctx := context.Background()
	key := []uint64{3}
	x := c.open(0)
	release := holdSnapshots(t, x)
	c.reconfigure(1, 2, 0) // epoch 3
	waitFor(t, "the predecessor's hello at the rejoined member", func() bool {
		x.mu.Lock()
		defer x.mu.Unlock()
		return len(x.inbound) > 0
	})
	w := c.addNode()
	c.reconfigure(1, 2, 0, w) // epoch 4: x is a middle member, unsynced
	time.Sleep(200 * time.Millisecond)
	nw := c.chain(w)
	if got := nw.AppliedIndex(); got != 0 {
		t.Errorf("new member applied up to %d from an unsynced predecessor", got)
	}
	out := make([]float32, 2)
	if ix, err := nw.Pull(ctx, key, out, ReadLinearizable); err == nil {
		t.Errorf("new tail behind an unsynced member served %v at index %d (committed %v, leftover %v)", out, ix, committed, leftover)
	}
	release()
	c.waitConverged(5 * time.Second)
	waitFor(t, "the new tail to serve reads", func() bool {
		_, err := nw.Pull(ctx, key, out, ReadLinearizable)
		return err == nil
	})
	if !equalF32(out, committed) {
		t.Fatalf("new tail read %v, want %v", out, committed)
	}
}

// holdSnapshots holds x's snapshot install back until release (or the
// test's end): the window between its predecessor's hello and the end of
// the handshake.
func holdSnapshots(t *testing.T, x *Chain) (release func()) {
	x.snapMu.Lock()
	var once sync.Once
	release = func() { once.Do(x.snapMu.Unlock) }
	t.Cleanup(release)
	return release
}
