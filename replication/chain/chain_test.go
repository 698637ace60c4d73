package chain

import (
	"context"
	"errors"
	"math"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/raftps/raftps/replication"
	"github.com/raftps/raftps/replication/internal/reptest"
	"github.com/raftps/raftps/store"
)

func TestChainReplicatesConcurrentPushes(t *testing.T) {
	c := newCluster(t, 3, testConfig(4))
	w := reptest.NewWorkload(4)
	runClients(t, c, w, 6, 60, nil)
	c.waitConverged(5 * time.Second)
	for i, ch := range c.live() {
		if got := ch.Role(); got != []Role{RoleHead, RoleMiddle, RoleTail}[i] {
			t.Errorf("member %d has role %s", i, got)
		}
		w.Check(t, ch.Table())
	}
	// Group commit: 360 pushes took fewer entries.
	if ix := c.head().AppliedIndex(); ix >= 360 {
		t.Logf("note: %d entries for 360 pushes (no batching happened)", ix)
	}

	// The same (client, seq) again: answered duplicate, applied once.
	h := c.head()
	p := &replication.Push{Client: 99, Seq: 1, Keys: []uint64{1000}, Grads: []float32{1, 2, 3, 4}}
	for attempt := range 3 {
		dup, err := h.Push(context.Background(), p)
		if err != nil {
			t.Fatal(err)
		}
		if dup != (attempt > 0) {
			t.Fatalf("attempt %d: duplicate = %v", attempt, dup)
		}
	}
	w.Acknowledge(p.Keys, p.Grads)
	c.waitConverged(5 * time.Second)
	for _, ch := range c.live() {
		w.Check(t, ch.Table())
	}
}

func TestChainRejectsBadPushes(t *testing.T) {
	c := newCluster(t, 2, testConfig(2))
	h := c.head()
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		p    *replication.Push
		want error
	}{
		{"zero client", &replication.Push{Client: 0, Seq: 1, Keys: []uint64{1}, Grads: []float32{1, 1}}, replication.ErrBadRequest},
		{"zero seq", &replication.Push{Client: 1, Seq: 0, Keys: []uint64{1}, Grads: []float32{1, 1}}, replication.ErrBadRequest},
		{"no keys", &replication.Push{Client: 1, Seq: 1}, replication.ErrBadRequest},
		{"wrong dim", &replication.Push{Client: 1, Seq: 1, Keys: []uint64{1}, Grads: []float32{1, 1, 1}}, store.ErrDimMismatch},
		{"NaN", &replication.Push{Client: 1, Seq: 1, Keys: []uint64{1}, Grads: []float32{1, float32(math.NaN())}}, store.ErrNonFinite},
		{"Inf", &replication.Push{Client: 1, Seq: 1, Keys: []uint64{1}, Grads: []float32{float32(math.Inf(-1)), 1}}, store.ErrNonFinite},
		{"too big", &replication.Push{Client: 1, Seq: 1, Keys: make([]uint64, 1<<20), Grads: make([]float32, 2<<20)}, replication.ErrBadRequest},
	} {
		if _, err := h.Push(ctx, tc.p); !errors.Is(err, tc.want) {
			t.Errorf("%s: got %v, want %v", tc.name, err, tc.want)
		}
	}
	if ix := h.AppliedIndex(); ix != 0 {
		t.Fatalf("bad pushes logged %d entries", ix)
	}
	// Pushes to the tail name the head.
	_, err := c.chain(1).Push(ctx, &replication.Push{Client: 1, Seq: 1, Keys: []uint64{1}, Grads: []float32{1, 1}})
	var nh *NotHeadError
	if !errors.As(err, &nh) || nh.Head != c.nodes[0].addr {
		t.Fatalf("push to the tail: %v, want a NotHeadError naming %s", err, c.nodes[0].addr)
	}
}

// TestChainMemberFailures kills the head, a middle member or the tail while
// clients push, reconfigures the survivors in a new epoch, and checks that
// every acknowledged push is present exactly once on every survivor.
func TestChainMemberFailures(t *testing.T) {
	for _, tc := range []struct {
		name   string
		kill   int
		remain []int
	}{
		{"head", 0, []int{1, 2}},
		{"middle", 1, []int{0, 2}},
		{"tail", 2, []int{0, 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t, 3, testConfig(3))
			w := reptest.NewWorkload(3)
			runClients(t, c, w, 4, 60, func() {
				c.stopNode(tc.kill)
				time.Sleep(20 * time.Millisecond) // pushes pile up meanwhile
				c.reconfigure(tc.remain...)
			})
			c.waitConverged(5 * time.Second)
			t.Logf("%d push attempts failed and were retried", c.retries.Load())
			if tc.kill == 0 && c.retries.Load() == 0 {
				t.Error("no push was pending when the head died: the test did not test that")
			}
			for _, ch := range c.live() {
				w.Check(t, ch.Table())
				if ch.Epoch() != 2 {
					t.Fatalf("epoch %d, want 2", ch.Epoch())
				}
			}
		})
	}
}

// TestChainDuplicateAcrossHeadChange retries a push, acknowledged by the
// old head, at the new head: it must be told duplicate and not applied again.
// A push whose outcome the old head never learnt is retried the same way.
func TestChainDuplicateAcrossHeadChange(t *testing.T) {
	c := newCluster(t, 3, testConfig(2))
	ctx := context.Background()
	w := reptest.NewWorkload(2)
	acked := &replication.Push{Client: 5, Seq: 1, Keys: []uint64{7}, Grads: []float32{1, 2}}
	if _, err := c.head().Push(ctx, acked); err != nil {
		t.Fatal(err)
	}
	w.Acknowledge(acked.Keys, acked.Grads)
	// An unacknowledged push: the head forwards nothing, so it stays
	// uncommitted (applied on the head only) until the head dies.
	lost := &replication.Push{Client: 5, Seq: 2, Keys: []uint64{8}, Grads: []float32{3, 4}}
	h := c.head()
	h.pauseForward.Store(true)
	pctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	_, err := h.Push(pctx, lost)
	cancel()
	if !errors.Is(err, replication.ErrUnknownOutcome) {
		t.Fatalf("push with forwarding paused: %v, want replication.ErrUnknownOutcome", err)
	}
	c.stopNode(0)
	c.reconfigure(1, 2)
	if dup, err := c.push(ctx, acked); err != nil || !dup {
		t.Fatalf("retry of an acknowledged push at the new head: duplicate %v, %v", dup, err)
	}
	if dup, err := c.push(ctx, lost); err != nil || dup {
		t.Fatalf("retry of a push the old head never forwarded: duplicate %v, %v (want applied now)", dup, err)
	}
	w.Acknowledge(lost.Keys, lost.Grads)
	if dup, err := c.push(ctx, lost); err != nil || !dup {
		t.Fatalf("second retry: duplicate %v, %v", dup, err)
	}
	c.waitConverged(5 * time.Second)
	for _, ch := range c.live() {
		w.Check(t, ch.Table())
	}
}

// TestChainRestartRecovers closes every replica and reopens it from its
// directory: the same rows and applied index come back (from a snapshot and
// the log after it), and the chain goes on.
func TestChainRestartRecovers(t *testing.T) {
	cfg := testConfig(3)
	cfg.SnapshotEvery = 16
	c := newCluster(t, 3, cfg)
	w := reptest.NewWorkload(3)
	runClients(t, c, w, 3, 40, nil)
	sum := c.waitConverged(5 * time.Second)
	applied := c.head().AppliedIndex()
	waitFor(t, "a snapshot on the middle member", func() bool {
		c.chain(1).applyMu.Lock()
		defer c.chain(1).applyMu.Unlock()
		return c.chain(1).snapIndex > 0
	})
	for i := range 3 {
		c.closeChain(i)
	}
	for i := range 3 {
		ch := c.open(i)
		if ch.AppliedIndex() != applied || ch.Checksum() != sum || ch.Epoch() != 1 || ch.Role() != []Role{RoleHead, RoleMiddle, RoleTail}[i] {
			t.Fatalf("replica %d reopened at index %d checksum %x epoch %d role %s; closed at %d %x 1 %s",
				i, ch.AppliedIndex(), ch.Checksum(), ch.Epoch(), ch.Role(), applied, sum, []Role{RoleHead, RoleMiddle, RoleTail}[i])
		}
		w.Check(t, ch.Table())
	}
	// One member restarts alone while pushes go on; it catches up.
	runClients(t, c, w, 2, 30, func() {
		c.closeChain(1)
		c.open(1)
	})
	c.waitConverged(5 * time.Second)
	for _, ch := range c.live() {
		w.Check(t, ch.Table())
	}
}

// TestChainNewMemberCopiesState appends an empty node at the tail of a
// chain whose log has been compacted: it gets a snapshot from the old tail,
// then follows.
func TestChainNewMemberCopiesState(t *testing.T) {
	cfg := testConfig(3)
	cfg.SnapshotEvery = 8
	c := newCluster(t, 2, cfg)
	w := reptest.NewWorkload(3)
	runClients(t, c, w, 3, 40, nil)
	c.waitConverged(5 * time.Second)
	waitFor(t, "the old tail's log compacted", func() bool {
		tl := c.chain(1)
		tl.applyMu.Lock()
		snap := tl.snapIndex
		tl.applyMu.Unlock()
		first, err := tl.st.firstIndex()
		return err == nil && snap > 0 && first != 1 // 0: every entry is in the snapshot
	})
	n := c.addNode()
	runClients(t, c, w, 3, 30, func() { c.reconfigure(0, 1, n) })
	c.waitConverged(5 * time.Second)
	if got := c.chain(n).Role(); got != RoleTail {
		t.Fatalf("new member's role is %s", got)
	}
	for _, ch := range c.live() {
		w.Check(t, ch.Table())
	}
	c.chain(n).applyMu.Lock()
	installed := c.chain(n).installs
	c.chain(n).applyMu.Unlock()
	if installed == 0 {
		t.Fatal("the new member did not install a snapshot")
	}
	// And it survives its own restart.
	c.closeChain(n)
	c.open(n)
	c.waitConverged(5 * time.Second)
}

func TestChainStaleEpoch(t *testing.T) {
	c := newCluster(t, 3, testConfig(2))
	h := c.head()
	addrs := []string{c.nodes[0].addr, c.nodes[1].addr, c.nodes[2].addr}
	if err := h.SetConfig(0, addrs); !errors.Is(err, ErrStaleEpoch) {
		t.Fatalf("older epoch: %v", err)
	}
	if err := h.SetConfig(1, []string{addrs[1], addrs[0], addrs[2]}); !errors.Is(err, ErrStaleEpoch) {
		t.Fatalf("same epoch, other order: %v", err)
	}
	if err := h.SetConfig(1, addrs); err != nil {
		t.Fatalf("same epoch, same order: %v", err)
	}
	// A read of the tail from an older epoch is refused.
	out := make([]float32, 2)
	if _, err := c.nodes[0].mux.tailRead(context.Background(), time.Second, addrs[2], "t/0", 0, []uint64{1}, out); !errors.Is(err, ErrStaleEpoch) {
		t.Fatalf("read of epoch 0: %v", err)
	}
	// The head moves to epoch 2 before the others: they refuse its stream
	// (epoch ahead), so nothing commits until they catch up.
	if err := h.SetConfig(2, addrs); err != nil {
		t.Fatal(err)
	}
	if _, err := c.nodes[0].mux.tailRead(context.Background(), time.Second, addrs[2], "t/0", 2, []uint64{1}, out); !errors.Is(err, ErrEpochAhead) {
		t.Fatalf("read of epoch 2 before the tail knows it: %v", err)
	}
	p := &replication.Push{Client: 1, Seq: 1, Keys: []uint64{1}, Grads: []float32{1, 1}}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	_, err := h.Push(ctx, p)
	cancel()
	if !errors.Is(err, replication.ErrUnknownOutcome) {
		t.Fatalf("push while the chain is split across epochs: %v", err)
	}
	if c.chain(1).AppliedIndex() != 0 || c.chain(2).AppliedIndex() != 0 {
		t.Fatal("members of epoch 1 accepted entries from epoch 2")
	}
	for _, i := range []int{1, 2} {
		if err := c.chain(i).SetConfig(2, addrs); err != nil {
			t.Fatal(err)
		}
	}
	c.mu.Lock()
	c.epoch = 2
	c.mu.Unlock()
	if dup, err := c.push(context.Background(), p); err != nil || !dup {
		t.Fatalf("retry after the others caught up: duplicate %v, %v", dup, err)
	}
	c.waitConverged(5 * time.Second)
	// A removed node stops serving.
	c.reconfigure(0, 1)
	if _, err := c.chain(2).Pull(context.Background(), []uint64{1}, out, ReadAny); !errors.Is(err, ErrNotMember) {
		t.Fatalf("read of a removed member: %v", err)
	}
	if _, err := c.chain(2).Push(context.Background(), p); !errors.Is(err, ErrNotHead) {
		t.Fatalf("push to a removed member: %v", err)
	}
}

// TestChainCRAQReads makes a key dirty on the head (its entry applied there,
// forwarding paused) and checks that a CRAQ read of it on the head returns
// the tail's committed value, while clean keys are served locally.
func TestChainCRAQReads(t *testing.T) {
	c := newCluster(t, 3, testConfig(2))
	ctx := context.Background()
	if _, err := c.push(ctx, &replication.Push{Client: 1, Seq: 1, Keys: []uint64{1, 2}, Grads: []float32{1, 1, 2, 2}}); err != nil {
		t.Fatal(err)
	}
	c.waitConverged(5 * time.Second)
	h, mid, tail := c.chain(0), c.chain(1), c.chain(2)
	keys := []uint64{1, 2}
	out := make([]float32, 4)
	pull := func(ch *Chain, mode ReadMode) []float32 {
		t.Helper()
		if _, err := ch.Pull(ctx, keys, out, mode); err != nil {
			t.Fatalf("%s read: %v", mode, err)
		}
		return append([]float32(nil), out...)
	}
	committed := []float32{-1, -1, -2, -2}
	for _, ch := range []*Chain{h, mid, tail} {
		if got := pull(ch, ReadCRAQ); !equalF32(got, committed) {
			t.Fatalf("clean CRAQ read = %v, want %v", got, committed)
		}
	}
	if _, err := h.Pull(ctx, keys, out, ReadLinearizable); !errors.Is(err, ErrNotTail) {
		t.Fatalf("linearizable read on the head: %v", err)
	}
	if got := pull(tail, ReadLinearizable); !equalF32(got, committed) {
		t.Fatalf("linearizable read on the tail = %v", got)
	}

	h.pauseForward.Store(true)
	done := make(chan error, 1)
	go func() {
		_, err := h.Push(ctx, &replication.Push{Client: 1, Seq: 2, Keys: []uint64{2}, Grads: []float32{10, 10}})
		done <- err
	}()
	waitFor(t, "the head to apply the push", func() bool { return h.AppliedIndex() == 2 })
	if got := pull(h, ReadAny); !equalF32(got, []float32{-1, -1, -12, -12}) {
		t.Fatalf("any-replica read on the head = %v, want its applied state", got)
	}
	if got := pull(h, ReadCRAQ); !equalF32(got, committed) {
		t.Fatalf("CRAQ read of a dirty key on the head = %v, want the tail's committed %v", got, committed)
	}
	h.pauseForward.Store(false)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	c.waitConverged(5 * time.Second)
	want := []float32{-1, -1, -12, -12}
	for _, ch := range []*Chain{h, mid, tail} {
		if got := pull(ch, ReadCRAQ); !equalF32(got, want) {
			t.Fatalf("CRAQ read after commit = %v, want %v", got, want)
		}
	}
}

// TestChainBrokenDisk closes a member's log underneath it: pushes fail with
// an error, and nothing is acknowledged.
func TestChainBrokenDisk(t *testing.T) {
	t.Run("head", func(t *testing.T) {
		c := newCluster(t, 3, testConfig(2))
		h := c.head()
		if err := h.st.db.Close(); err != nil {
			t.Fatal(err)
		}
		p := &replication.Push{Client: 1, Seq: 1, Keys: []uint64{1}, Grads: []float32{1, 1}}
		if _, err := h.Push(context.Background(), p); !errors.Is(err, ErrReplicaBroken) {
			t.Fatalf("push to a head whose disk failed: %v", err)
		}
		if _, err := h.Push(context.Background(), p); !errors.Is(err, ErrReplicaBroken) {
			t.Fatalf("second push: %v", err)
		}
		for _, ch := range c.live() {
			if ch.AppliedIndex() != 0 || ch.Checksum() != c.chain(2).Checksum() {
				t.Fatal("a push that failed to persist was applied")
			}
		}
	})
	t.Run("middle", func(t *testing.T) {
		c := newCluster(t, 3, testConfig(2))
		if err := c.chain(1).st.db.Close(); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		_, err := c.head().Push(ctx, &replication.Push{Client: 1, Seq: 1, Keys: []uint64{1}, Grads: []float32{1, 1}})
		if !errors.Is(err, replication.ErrUnknownOutcome) {
			t.Fatalf("push through a middle whose disk failed: %v, want no acknowledgement", err)
		}
		if !errors.Is(c.chain(1).Err(), ErrReplicaBroken) {
			t.Fatalf("middle's error: %v", c.chain(1).Err())
		}
		if c.chain(2).AppliedIndex() != 0 || c.chain(1).AppliedIndex() != 0 {
			t.Fatal("entry passed a member that failed to persist it")
		}
	})
}

func equalF32(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// TestChainCloseLeavesNoGoroutines closes replicas with pushes waiting and
// streams open: every goroutine of theirs ends, and the waiting pushes get
// an answer.
func TestChainCloseLeavesNoGoroutines(t *testing.T) {
	c := newCluster(t, 3, testConfig(2))
	ctx := context.Background()
	if _, err := c.push(ctx, &replication.Push{Client: 1, Seq: 1, Keys: []uint64{1}, Grads: []float32{1, 1}}); err != nil {
		t.Fatal(err)
	}
	h := c.head()
	h.pauseForward.Store(true)
	done := make(chan error, 1)
	go func() {
		_, err := h.Push(ctx, &replication.Push{Client: 1, Seq: 2, Keys: []uint64{1}, Grads: []float32{1, 1}})
		done <- err
	}()
	waitFor(t, "the head to apply the push", func() bool { return h.AppliedIndex() == 2 })
	for i := range 3 {
		c.closeChain(i)
	}
	if err := <-done; !errors.Is(err, replication.ErrUnknownOutcome) {
		t.Fatalf("push waiting at Close: %v, want replication.ErrUnknownOutcome", err)
	}
	waitFor(t, "the replicas' goroutines to end", func() bool {
		buf := make([]byte, 1<<20)
		stacks := string(buf[:runtime.Stack(buf, true)])
		return !strings.Contains(stacks, "chain.(*Chain)")
	})
}

// TestChainRejoinAfterDivergence brings back, at the tail, a head that was
// removed holding an entry nobody else got (so its log diverges from the
// chain's at that index): the handshake sees the mismatch and replaces its
// state with a snapshot, and the push in that entry counts once.
func TestChainRejoinAfterDivergence(t *testing.T) {
	c := newCluster(t, 3, testConfig(2))
	ctx := context.Background()
	w := reptest.NewWorkload(2)
	runClients(t, c, w, 2, 10, nil)
	h := c.head()
	h.pauseForward.Store(true)
	lost := &replication.Push{Client: 77, Seq: 1, Keys: []uint64{3}, Grads: []float32{1, 2}}
	pctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	if _, err := h.Push(pctx, lost); !errors.Is(err, replication.ErrUnknownOutcome) {
		t.Fatalf("push with forwarding paused: %v", err)
	}
	cancel()
	diverged := h.AppliedIndex()
	c.closeChain(0)
	c.reconfigure(1, 2)
	if _, err := c.push(ctx, &replication.Push{Client: 78, Seq: 1, Keys: []uint64{4}, Grads: []float32{1, 1}}); err != nil {
		t.Fatal(err)
	}
	w.Acknowledge([]uint64{4}, []float32{1, 1})
	if _, err := c.push(ctx, lost); err != nil {
		t.Fatal(err)
	}
	w.Acknowledge(lost.Keys, lost.Grads)
	if c.chain(1).AppliedIndex() < diverged {
		t.Fatalf("new head at %d, below the old head's diverged entry %d", c.chain(1).AppliedIndex(), diverged)
	}
	old := c.open(0) // still epoch 1, where it was head: it must not disturb the chain
	if old.Epoch() != 1 || old.AppliedIndex() != diverged {
		t.Fatalf("reopened old head at epoch %d index %d", old.Epoch(), old.AppliedIndex())
	}
	c.reconfigure(1, 2, 0)
	runClients(t, c, w, 2, 10, nil)
	c.waitConverged(5 * time.Second)
	for _, ch := range c.live() {
		w.Check(t, ch.Table())
	}
	old.applyMu.Lock()
	installs := old.installs
	old.applyMu.Unlock()
	if installs == 0 {
		t.Fatal("the diverged member was not given a snapshot")
	}
}
