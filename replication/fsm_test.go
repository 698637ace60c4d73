package replication

import (
	"bytes"
	"errors"
	"io"
	"math"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/raftps/raftps/replication/internal/reptest"
	"github.com/raftps/raftps/store"
)

func TestPushBatchRoundTrip(t *testing.T) {
	pushes := []*Push{
		{Client: 1, Seq: 7, Keys: []uint64{1, 2}, Grads: []float32{1, 2, 3, 4}},
		{Client: math.MaxUint64, Seq: 1, Keys: []uint64{math.MaxUint64}, Grads: []float32{-0.5, float32(math.SmallestNonzeroFloat32)}},
		// bfloat16 gradients (values bfloat16 holds), beside float32 ones
		// in the same entry, as a batch of a bf16 table's pushes and of
		// an older client's float32 pushes would never be, but the format
		// allows.
		{Client: 3, Seq: 2, Keys: []uint64{5, 6}, Grads: []float32{store.RoundBF16(0.1), -2, store.RoundBF16(3e38), float32(math.Inf(-1))}, BF16: true},
	}
	if got, want := pushes[2].encodedSize(), 8+8+4+2*8+4*store.BF16Bytes; got != want {
		t.Fatalf("bf16 push encodes in %d bytes, want %d", got, want)
	}
	cmd := encodePushBatch(12345, pushes)
	var r pushBatchReader
	if err := r.reset(cmd, 2); err != nil {
		t.Fatal(err)
	}
	if r.leaderTime != 12345 {
		t.Fatalf("leader time %d", r.leaderTime)
	}
	for i, want := range pushes {
		got, err := r.next()
		if err != nil || got == nil {
			t.Fatalf("push %d: %v", i, err)
		}
		if got.Client != want.Client || got.Seq != want.Seq || got.BF16 != want.BF16 || !reflect.DeepEqual(got.Keys, want.Keys) || !reflect.DeepEqual(got.Grads, want.Grads) {
			t.Fatalf("push %d: got %+v want %+v", i, got, want)
		}
	}
	if p, err := r.next(); p != nil || err != nil {
		t.Fatalf("after last: %v %v", p, err)
	}
	// PushedKeys lists the keys of every push, and of a noop none.
	if got := PushedKeys([]uint64{9}, cmd, 2); !reflect.DeepEqual(got, []uint64{9, 1, 2, math.MaxUint64, 5, 6}) {
		t.Fatalf("PushedKeys = %v", got)
	}
	if got := PushedKeys(nil, []byte{cmdNoop}, 2); len(got) != 0 {
		t.Fatalf("PushedKeys of a noop = %v", got)
	}
	// Every truncation is an error, never a panic or a short push.
	for n := range len(cmd) {
		if r.reset(cmd[:n], 2) != nil {
			continue
		}
		var err error
		for p := (*Push)(nil); err == nil; {
			if p, err = r.next(); p == nil && err == nil {
				t.Fatalf("truncated to %d of %d bytes: read to the end without error", n, len(cmd))
			}
		}
		// PushedKeys keeps the keys of the whole pushes before the cut.
		all := []uint64{1, 2, math.MaxUint64, 5, 6}
		if got := PushedKeys(nil, cmd[:n], 2); len(got) >= len(all) || !slices.Equal(got, all[:len(got)]) {
			t.Fatalf("PushedKeys of %d of %d bytes = %v", n, len(cmd), got)
		}
	}
}

func TestDedupeWindow(t *testing.T) {
	d := newDedupe(time.Hour)
	now := int64(1000)
	applied := func(c, s uint64) bool {
		err := d.check(c, s, now)
		if err == nil {
			d.record(c, s, now)
			return false
		}
		if errors.Is(err, errDuplicate) {
			return true
		}
		t.Fatalf("check(%d, %d): %v", c, s, err)
		return false
	}
	// In order, out of order, and gaps: each seq applies once.
	for _, s := range []uint64{1, 2, 5, 3, 4, 100, 70, 99, 37} {
		if applied(9, s) {
			t.Fatalf("seq %d new but reported duplicate", s)
		}
		if !applied(9, s) {
			t.Fatalf("seq %d applied twice", s)
		}
	}
	if applied(9, 6) {
		t.Fatal("seq 6 was never applied")
	}
	// Window shifts across word boundaries keep their bits.
	if applied(9, 100+63) || !applied(9, 100) || !applied(9, 37) {
		t.Fatal("window lost bits when shifting by 63")
	}
	if applied(9, 163+130) || !applied(9, 163) || !applied(9, 100) {
		t.Fatal("window lost bits when shifting by 130")
	}
	// Too old is an error, not a silent drop.
	if err := d.check(9, 293-DedupeWindow, now); !errors.Is(err, ErrSequenceTooOld) {
		t.Fatalf("seq below the window: %v", err)
	}
	// Clients are independent.
	if applied(10, 5) {
		t.Fatal("client 10 sees client 9's seqs")
	}
	// Serialisation round trip is exact and deterministic.
	a := d.appendTo(nil)
	d2 := newDedupe(time.Hour)
	if n, err := d2.decode(a); err != nil || n != len(a) {
		t.Fatalf("decode: %d %v", n, err)
	}
	if !bytes.Equal(a, d2.appendTo(nil)) || !reflect.DeepEqual(d.clients, d2.clients) {
		t.Fatal("dedupe state changed across a round trip")
	}
	// A window idle past the TTL answers as absent, deleted or not.
	later := now + int64(2*time.Hour)
	if err := d.check(9, 163, later); err != nil {
		t.Fatalf("expired window still answers: %v", err)
	}
	d.expire(later)
	if len(d.clients) != 0 {
		t.Fatalf("%d windows survive expiry", len(d.clients))
	}
}

func applyCmd(t *testing.T, f *FSM, ix uint64, pushes ...*Push) *ApplyResult {
	t.Helper()
	res := raftFSM{FSM: f}.Apply(&raft.Log{Index: ix, Type: raft.LogCommand, Data: encodePushBatch(int64(ix), pushes)})
	br, ok := res.(*ApplyResult)
	if !ok || br.err != nil {
		t.Fatalf("apply %d: %#v", ix, res)
	}
	return br
}

func TestFSMAppliesOnceAndIsolatesBadPushes(t *testing.T) {
	f, err := NewFSM("g", reptest.SGDTable("t", 2), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	good := &Push{Client: 1, Seq: 1, Keys: []uint64{5}, Grads: []float32{-1, -2}}
	nan := &Push{Client: 1, Seq: 2, Keys: []uint64{6}, Grads: []float32{float32(math.NaN()), 0}}
	res := applyCmd(t, f, 1, good, nan, good)
	if res.outcomes[0].err != nil || res.outcomes[0].duplicate {
		t.Fatalf("first push: %+v", res.outcomes[0])
	}
	if !errors.Is(res.outcomes[1].err, store.ErrNonFinite) {
		t.Fatalf("NaN push: %+v", res.outcomes[1])
	}
	if !res.outcomes[2].duplicate {
		t.Fatalf("repeated push in the same entry: %+v", res.outcomes[2])
	}
	// A retry of the same (client, seq) in a later entry is a duplicate too;
	// the failed seq 2 is not recorded, so a corrected retry applies.
	res = applyCmd(t, f, 2, good, &Push{Client: 1, Seq: 2, Keys: []uint64{6}, Grads: []float32{-3, 0}})
	if !res.outcomes[0].duplicate || res.outcomes[1].err != nil || res.outcomes[1].duplicate {
		t.Fatalf("retries: %+v", res.outcomes)
	}
	out := make([]float32, 4)
	if err := f.table.Load().Lookup([]uint64{5, 6}, out); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(out, []float32{1, 2, 3, 0}) {
		t.Fatalf("rows %v, want [1 2 3 0]", out)
	}
	if f.appliedIx.Load() != 2 {
		t.Fatalf("applied index %d", f.appliedIx.Load())
	}
}

type memSink struct {
	bytes.Buffer
	canceled bool
}

func (s *memSink) ID() string    { return "mem" }
func (s *memSink) Cancel() error { s.canceled = true; return nil }
func (s *memSink) Close() error  { return nil }

func TestFSMSnapshotRestoreKeepsDedupe(t *testing.T) {
	f, _ := NewFSM("g", reptest.SGDTable("t", 3), time.Hour)
	for i := uint64(1); i <= 50; i++ {
		applyCmd(t, f, i, &Push{Client: i%4 + 1, Seq: i, Keys: []uint64{i % 7, i % 5}, Grads: []float32{1, 2, 3, 4, 5, 6}})
	}
	snap, err := raftFSM{FSM: f}.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	// Applies continue while the snapshot is persisted; it holds index 50.
	applyCmd(t, f, 51, &Push{Client: 9, Seq: 1, Keys: []uint64{1}, Grads: []float32{1, 1, 1}})
	var sink memSink
	if err := snap.Persist(&sink); err != nil {
		t.Fatal(err)
	}
	snap.Release()

	g, _ := NewFSM("g", reptest.SGDTable("t", 3), time.Hour)
	if err := g.Restore(io.NopCloser(bytes.NewReader(sink.Bytes()))); err != nil {
		t.Fatal(err)
	}
	if g.appliedIx.Load() != 50 {
		t.Fatalf("restored applied index %d, want 50", g.appliedIx.Load())
	}
	// Replaying entry 51 and re-sending an old push gives the original's state.
	applyCmd(t, g, 51, &Push{Client: 9, Seq: 1, Keys: []uint64{1}, Grads: []float32{1, 1, 1}})
	res := applyCmd(t, g, 52, &Push{Client: 50%4 + 1, Seq: 50, Keys: []uint64{0}, Grads: []float32{9, 9, 9}})
	if !res.outcomes[0].duplicate {
		t.Fatal("dedupe state lost in the snapshot")
	}
	if g.table.Load().Checksum() != f.table.Load().Checksum() {
		t.Fatal("restored FSM diverged")
	}
	// Corrupt and mismatched snapshots are refused, and change nothing.
	before := g.table.Load().Checksum()
	bad := bytes.Clone(sink.Bytes())
	bad[20] ^= 0xff
	if err := g.Restore(io.NopCloser(bytes.NewReader(bad))); !errors.Is(err, store.ErrCorruptSnapshot) {
		t.Fatalf("corrupt snapshot: %v", err)
	}
	other, _ := NewFSM("g", reptest.SGDTable("t", 4), time.Hour)
	if err := other.Restore(io.NopCloser(bytes.NewReader(sink.Bytes()))); !errors.Is(err, store.ErrConfigMismatch) {
		t.Fatalf("snapshot of another table: %v", err)
	}
	if g.table.Load().Checksum() != before || g.appliedIx.Load() != 52 {
		t.Fatal("a refused restore changed the FSM")
	}
}
