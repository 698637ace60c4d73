package store

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"testing"
)

func snapshotBytes(t testing.TB, tab *Table) []byte {
	t.Helper()
	s := tab.Snapshot()
	defer s.Release()
	var buf bytes.Buffer
	n, err := s.WriteTo(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if n != int64(buf.Len()) {
		t.Fatalf("WriteTo reported %d bytes, wrote %d", n, buf.Len())
	}
	return buf.Bytes()
}

func TestSnapshotRoundTrip(t *testing.T) {
	for _, opt := range optimizerCases() {
		cfg := TableConfig{Name: "rt", Dim: 5, Init: Initializer{Kind: InitUniform, Scale: 0.1}, Optimizer: opt, Seed: 1}
		t.Run(opt.String(), func(t *testing.T) {
			tab := mustTable(t, cfg)
			ref := newRef(cfg)
			rng := rand.New(rand.NewPCG(3, 4))
			for range 40 {
				keys, grads := randomBatch(rng, 50, 3000, 5, 1)
				mustApply(t, tab, keys, grads)
				ref.apply(keys, grads)
			}
			loaded, err := Load(bytes.NewReader(snapshotBytes(t, tab)))
			if err != nil {
				t.Fatal(err)
			}
			if loaded.Checksum() != tab.Checksum() {
				t.Fatal("checksum changed across snapshot and load")
			}
			compareWithRef(t, loaded, ref)
			// The loaded table goes on exactly like the original.
			keys, grads := randomBatch(rng, 50, 3000, 5, 1)
			mustApply(t, loaded, keys, grads)
			ref.apply(keys, grads)
			compareWithRef(t, loaded, ref)
		})
	}
}

func mustApply(t testing.TB, tab *Table, keys []uint64, grads []float32) {
	t.Helper()
	if err := tab.Apply(keys, grads); err != nil {
		t.Fatal(err)
	}
}

// TestSnapshotIsPointInTime: a snapshot taken before more Applies (which change
// rows it has not read yet, and add new rows) still yields the state at the
// time it was taken, and Applies between blocks of its reading do too.
func TestSnapshotIsPointInTime(t *testing.T) {
	cfg := TableConfig{Name: "pit", Dim: 64, Optimizer: DefaultOptimizer(Adam), Seed: 5}
	tab := mustTable(t, cfg)
	rng := rand.New(rand.NewPCG(5, 6))
	for range 20 {
		keys, grads := randomBatch(rng, 1000, 5000, 64, 1)
		mustApply(t, tab, keys, grads)
	}
	before := tab.Checksum()
	beforeRows := tab.Len()
	s := tab.Snapshot()
	defer s.Release()
	// Change many rows before the snapshot is read at all...
	keys, grads := randomBatch(rng, 2000, 10000, 64, 1)
	mustApply(t, tab, keys, grads)
	// ...and more while it is being read, between blocks.
	var buf bytes.Buffer
	blocks := 0
	sum, err := s.each(func(block []byte, rows int) error {
		blocks++
		buf.Write(block)
		keys, grads := randomBatch(rng, 500, 10000, 64, 1)
		return tab.Apply(keys, grads)
	})
	if err != nil {
		t.Fatal(err)
	}
	if blocks < 3 {
		t.Fatalf("only %d blocks; the test needs several", blocks)
	}
	if sum != before {
		t.Fatalf("snapshot digest %x, state when taken %x", sum, before)
	}
	if buf.Len() != beforeRows*tab.l.stride*4 {
		t.Fatalf("snapshot has %d bytes, want %d rows", buf.Len(), beforeRows)
	}
	if tab.Checksum() == before {
		t.Fatal("table did not change after the snapshot; the test tests nothing")
	}
	if _, err := s.Checksum(); err == nil {
		t.Fatal("a snapshot read twice must fail")
	}
	s.Release()
	if len(tab.views) != 0 {
		t.Fatal("released snapshot still registered")
	}
	if _, err := s.Checksum(); !errors.Is(err, ErrSnapshotReleased) {
		t.Fatalf("read after release: %v", err)
	}
}

// TestSnapshotPropertyRandomOps: random sequences of Apply, Snapshot (left open
// while applying), Restore and Load give the same state as the same Applies
// with no snapshot at all.
func TestSnapshotPropertyRandomOps(t *testing.T) {
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 77))
		opt := optimizerCases()[rng.IntN(len(optimizerCases()))]
		cfg := TableConfig{Name: "prop", Dim: 1 + rng.IntN(9), Init: Initializer{Kind: InitNormal, Scale: 0.2}, Optimizer: opt, Seed: seed}
		plain, subject := mustTable(t, cfg), mustTable(t, cfg)
		var open []*Snapshot
		var openSums []uint64
		for step := range 60 {
			switch r := rng.IntN(10); {
			case r < 6:
				keys, grads := randomBatch(rng, 1+rng.IntN(200), 400, cfg.Dim, 2)
				mustApply(t, plain, keys, grads)
				mustApply(t, subject, keys, grads)
			case r < 7:
				open = append(open, subject.Snapshot())
				openSums = append(openSums, plain.Checksum())
			case r < 8 && len(open) > 0:
				i := rng.IntN(len(open))
				var buf bytes.Buffer
				if _, err := open[i].WriteTo(&buf); err != nil {
					t.Fatal(err)
				}
				open[i].Release()
				loaded, err := Load(&buf)
				if err != nil {
					t.Fatalf("seed %d step %d: %v", seed, step, err)
				}
				if loaded.Checksum() != openSums[i] {
					t.Fatalf("seed %d step %d: snapshot held state %x, it was %x when taken", seed, step, loaded.Checksum(), openSums[i])
				}
				open = append(open[:i], open[i+1:]...)
				openSums = append(openSums[:i], openSums[i+1:]...)
			case r < 9:
				if err := subject.Restore(bytes.NewReader(snapshotBytes(t, subject))); err != nil {
					t.Fatal(err)
				}
			default:
				loaded, err := Load(bytes.NewReader(snapshotBytes(t, subject)))
				if err != nil {
					t.Fatal(err)
				}
				subject = loaded
				open, openSums = nil, nil // they belong to the old table
			}
			if subject.Checksum() != plain.Checksum() {
				t.Fatalf("seed %d step %d: checksum diverged from the plain sequence", seed, step)
			}
		}
		for _, s := range open {
			s.Release()
		}
	}
}

func TestChecksumDetectsDifferences(t *testing.T) {
	cfg := adagradCfg(4)
	a, b := mustTable(t, cfg), mustTable(t, cfg)
	// Same rows created in different orders: same checksum.
	mustApply(t, a, []uint64{1, 2, 3}, make([]float32, 12))
	mustApply(t, b, []uint64{3, 1, 2}, make([]float32, 12))
	if a.Checksum() != b.Checksum() {
		t.Fatal("creation order changed the checksum")
	}
	// One column of one row changed: different.
	g := make([]float32, 4)
	g[2] = 1e-3
	mustApply(t, b, []uint64{2}, g)
	if a.Checksum() == b.Checksum() {
		t.Fatal("checksum missed a changed row")
	}
	// Same values, different optimizer state: an Adam step with a zero
	// gradient leaves values, m and v alone and advances only the row's step.
	adam := TableConfig{Name: "a", Dim: 4, Optimizer: DefaultOptimizer(Adam)}
	c, d := mustTable(t, adam), mustTable(t, adam)
	mustApply(t, c, []uint64{1}, []float32{0, 0, 0, 0})
	mustApply(t, d, []uint64{1}, []float32{0, 0, 0, 0})
	mustApply(t, d, []uint64{1}, []float32{0, 0, 0, 0})
	vc, vd := make([]float32, 4), make([]float32, 4)
	_ = c.Lookup([]uint64{1}, vc)
	_ = d.Lookup([]uint64{1}, vd)
	if vc[0] != vd[0] || c.Checksum() == d.Checksum() {
		t.Fatal("checksum does not cover optimizer state")
	}
}

func TestLoadRejectsCorruption(t *testing.T) {
	tab := mustTable(t, adagradCfg(3))
	rng := rand.New(rand.NewPCG(8, 9))
	keys, grads := randomBatch(rng, 300, 1000, 3, 1)
	mustApply(t, tab, keys, grads)
	good := snapshotBytes(t, tab)
	if _, err := Load(bytes.NewReader(good)); err != nil {
		t.Fatal(err)
	}
	// Every truncation.
	for n := 0; n < len(good); n++ {
		if _, err := Load(bytes.NewReader(good[:n])); !errors.Is(err, ErrCorruptSnapshot) {
			t.Fatalf("truncated to %d of %d bytes: err = %v", n, len(good), err)
		}
	}
	// Every single-bit flip at a spread of positions.
	for pos := 0; pos < len(good); pos += 1 + pos/50 {
		bad := bytes.Clone(good)
		bad[pos] ^= 1 << (pos % 8)
		_, err := Load(bytes.NewReader(bad))
		if !errors.Is(err, ErrCorruptSnapshot) && !errors.Is(err, ErrSnapshotVersion) {
			t.Fatalf("bit flip at byte %d: err = %v", pos, err)
		}
	}
	// A version from the future.
	bad := bytes.Clone(good)
	binary.LittleEndian.PutUint32(bad[8:], 9)
	if _, err := Load(bytes.NewReader(bad)); !errors.Is(err, ErrSnapshotVersion) {
		t.Fatalf("future version: %v", err)
	}
	// Restore of a corrupt stream, or of another table's, leaves the target as it was.
	target := mustTable(t, adagradCfg(3))
	mustApply(t, target, []uint64{42}, []float32{1, 2, 3})
	sum := target.Checksum()
	if err := target.Restore(bytes.NewReader(good[:len(good)-1])); !errors.Is(err, ErrCorruptSnapshot) {
		t.Fatalf("restore of truncated stream: %v", err)
	}
	other := mustTable(t, adagradCfg(4))
	if err := target.Restore(bytes.NewReader(snapshotBytes(t, other))); !errors.Is(err, ErrConfigMismatch) {
		t.Fatalf("restore of another table's snapshot: %v", err)
	}
	if target.Checksum() != sum || target.Len() != 1 {
		t.Fatal("failed restore changed the table")
	}
	if err := target.Restore(bytes.NewReader(good)); err != nil {
		t.Fatal(err)
	}
	if target.Checksum() != tab.Checksum() {
		t.Fatal("restore did not give the snapshot's state")
	}
}

func FuzzLoad(f *testing.F) {
	for _, opt := range optimizerCases()[:4] {
		tab := mustTable(f, TableConfig{Name: "f", Dim: 2, Optimizer: opt})
		mustApply(f, tab, []uint64{1, 2, 3}, []float32{1, 2, 3, 4, 5, 6})
		f.Add(snapshotBytes(f, tab))
	}
	f.Add([]byte(snapshotMagic))
	f.Fuzz(func(t *testing.T, data []byte) {
		tab, err := Load(bytes.NewReader(data))
		if err != nil {
			if !errors.Is(err, ErrCorruptSnapshot) && !errors.Is(err, ErrSnapshotVersion) {
				t.Fatalf("unexpected error kind: %v", err)
			}
			return
		}
		// Whatever loads must be a working table whose snapshot loads again
		// to the same state.
		again, err := Load(bytes.NewReader(snapshotBytes(t, tab)))
		if err != nil || again.Checksum() != tab.Checksum() {
			t.Fatalf("loaded table does not round-trip: %v", err)
		}
	})
}
