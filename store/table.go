package store

import (
	"fmt"
	"math"
	"runtime"
	"sync"
	"unsafe"
)

// Table is one shard of an embedding table: rows keyed by uint64, each with its
// optimizer state, created on first push.
//
// Concurrency: every method is safe for concurrent use. Apply and Restore are
// serialised against each other. Lookup, Snapshot readers and Checksum run in
// parallel with each other and with most of an Apply: an Apply computes its new
// rows outside the lock and holds the write lock only to copy them in.
type Table struct {
	cfg    TableConfig
	l      layout
	kernel kernel

	// writeMu admits one writer (Apply, Restore) at a time. The writer may read
	// rows without mu: only a holder of writeMu changes them.
	writeMu sync.Mutex
	scratch applyScratch // owned by the holder of writeMu

	// mu guards rows, ix and views. Readers hold it shared for a whole batch,
	// so a Lookup sees the state between two Applies, never part of one.
	mu    sync.RWMutex
	rows  *slab
	ix    *index
	views []*view // open snapshots; Apply preserves rows they have not read yet
}

// NewTable returns an empty table, or an error naming the bad config field.
func NewTable(cfg TableConfig) (*Table, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	l := newLayout(cfg.Dim, cfg.Optimizer.Kind)
	t := &Table{cfg: cfg, l: l, kernel: kernelFor(cfg.Optimizer.Kind), rows: newSlab(l), ix: new(index)}
	return t, nil
}

// Config returns the table's config.
func (t *Table) Config() TableConfig { return t.cfg }

// Name returns the table's name.
func (t *Table) Name() string { return t.cfg.Name }

// Dim returns the length of a row.
func (t *Table) Dim() int { return t.cfg.Dim }

// Len returns the number of rows that exist (keys pushed at least once).
func (t *Table) Len() int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return int(t.rows.n)
}

// MemoryBytes returns the bytes the table holds: row slabs, index, and the
// copies open snapshots keep of rows changed since they were taken.
func (t *Table) MemoryBytes() int64 {
	t.mu.RLock()
	defer t.mu.RUnlock()
	b := t.rows.bytes() + t.ix.bytes()
	for _, v := range t.views {
		b += v.bytes()
	}
	return b
}

// Lookup copies the values of keys' rows into out, row after row, so
// len(out) must be len(keys)*Dim(). A key with no row gets the initializer's
// values; no row is created.
//
// A Lookup concurrent with Apply observes each Apply entirely or not at all:
// all rows of out come from the same state between two Applies.
func (t *Table) Lookup(keys []uint64, out []float32) error {
	dim := t.cfg.Dim
	if len(out) != len(keys)*dim {
		return fmt.Errorf("table %q: %w: lookup buffer has %d values for %d keys of dim %d (want %d)",
			t.cfg.Name, ErrDimMismatch, len(out), len(keys), dim, len(keys)*dim)
	}
	t.mu.RLock()
	defer t.mu.RUnlock()
	hdr := t.l.hdr
	var slots [groupSize]int64
	var sink uint64
	defer runtime.KeepAlive(&sink)
	for g := 0; g < len(keys); g += groupSize {
		group := keys[g:min(g+groupSize, len(keys))]
		sink += t.ix.locateGroup(t.rows, group, slots[:])
		for i, k := range group {
			dst := out[(g+i)*dim : (g+i+1)*dim]
			if slot := slots[i]; slot >= 0 {
				copy(dst, t.rows.row(uint32(slot))[hdr:hdr+dim])
			} else {
				initRow(t.cfg.Init, t.cfg.Seed, k, dst)
			}
		}
	}
	return nil
}

// applyScratch is reused by every Apply so the hot path does not allocate.
type applyScratch struct {
	gen   uint32
	dedup []uint64 // gen<<32 | unique index+1; open addressing by key hash
	uidx  []int32  // for each batch position, its key's index in ukeys
	ukeys []uint64 // unique keys in order of first occurrence
	upos  []int32  // position of each unique key's first occurrence
	slots []int64  // each unique key's slot, -1 for a new row
	gsum  []float32
	stage []float32 // each unique key's updated row, stride words
	sink  uint64    // loads made only to bring rows into cache go here
}

func (s *applyScratch) reset(n, dim, stride int) {
	size := 16
	for size < 2*n {
		size <<= 1
	}
	if len(s.dedup) < size || s.gen == math.MaxUint32 {
		s.dedup = make([]uint64, size)
		s.gen = 0
	}
	s.gen++
	s.ukeys, s.upos = s.ukeys[:0], s.upos[:0]
	if cap(s.slots) < n {
		s.slots = make([]int64, n)
		s.uidx = make([]int32, n)
	}
	s.gsum = grow(s.gsum, n*dim)
	s.stage = grow(s.stage, n*stride)
}

func grow(b []float32, n int) []float32 {
	if cap(b) < n {
		return make([]float32, n)
	}
	return b[:n]
}

// unique returns the index among s.ukeys of key, adding it if it is new.
func (s *applyScratch) unique(key uint64, pos int) int32 {
	mask := uint64(len(s.dedup) - 1)
	for i := hashKey(key) & mask; ; i = (i + 1) & mask {
		e := s.dedup[i]
		if uint32(e>>32) != s.gen {
			u := len(s.ukeys)
			s.dedup[i] = uint64(s.gen)<<32 | uint64(u+1)
			s.ukeys = append(s.ukeys, key)
			s.upos = append(s.upos, int32(pos))
			return int32(u)
		}
		if u := int32(uint32(e)) - 1; s.ukeys[u] == key {
			return u
		}
	}
}

// Apply pushes one batch of gradients: grads holds len(keys) rows of Dim()
// values, row i for keys[i]. Gradients of a key that occurs more than once are
// summed in batch order first; then the optimizer updates each distinct key
// once, in order of first occurrence. Rows that do not exist are created with
// the initializer's values and fresh optimizer state.
//
// The batch is applied whole or not at all: a length mismatch, a NaN or Inf
// gradient, a sum of gradients that overflows, or an update that would make a
// row or its state non-finite rejects it with an error naming the table, key
// and position, and leaves the table as it was.
func (t *Table) Apply(keys []uint64, grads []float32) error {
	dim, stride, name := t.cfg.Dim, t.l.stride, t.cfg.Name
	if err := t.checkLen(keys, grads); err != nil {
		return err
	}
	if len(keys) == 0 {
		return nil
	}

	t.writeMu.Lock()
	defer t.writeMu.Unlock()
	s := &t.scratch
	s.reset(len(keys), dim, stride)

	// Find the distinct keys. Without duplicates (the usual case: clients
	// dedup before they push) the gradients are used where they lie; with
	// them, each key's gradients are summed in batch order.
	for p, k := range keys {
		s.uidx[p] = s.unique(k, p)
	}
	nu := len(s.ukeys)
	gs := grads
	if nu < len(keys) {
		gs = s.gsum[:nu*dim]
		for p, u := range s.uidx[:len(keys)] {
			g, sum := grads[p*dim:(p+1)*dim], gs[int(u)*dim:(int(u)+1)*dim]
			if s.upos[u] == int32(p) {
				copy(sum, g)
				continue
			}
			for c := range sum {
				sum[c] += g[c]
			}
		}
	}
	// A NaN or Inf gradient makes its key's sum non-finite too, so one check
	// covers both; the slow path finds what to report.
	if !allFinite(gs) {
		return t.nonFiniteGradient(keys, grads)
	}

	// Stage every updated row without the lock: only this writer changes rows.
	opt, l := &t.cfg.Optimizer, t.l
	s.slots = s.slots[:nu]
	for g := 0; g < nu; g += groupSize {
		s.sink += t.ix.locateGroup(t.rows, s.ukeys[g:min(g+groupSize, nu)], s.slots[g:])
	}
	var bad uint32
	for u, k := range s.ukeys {
		st := s.stage[u*stride : (u+1)*stride]
		in := st
		if slot := s.slots[u]; slot >= 0 {
			in = t.rows.row(uint32(slot))
		} else {
			clear(st)
			setKey(st, k)
			initRow(t.cfg.Init, t.cfg.Seed, k, l.values(st))
			initState(opt, l, st)
		}
		bad |= t.kernel(opt, l, in, st, gs[u*dim:(u+1)*dim])
	}
	if words := l.hdr + dim*(1+l.slots); bad&nonFiniteBit != 0 {
		for u, k := range s.ukeys {
			st := s.stage[u*stride : (u+1)*stride]
			for c, v := range st[l.hdr:words] {
				if isNonFinite(v) {
					what, col := "value", c
					if c >= dim {
						what, col = "optimizer state", c%dim
					}
					return fmt.Errorf("table %q: %w: update of key %d (first at position %d) makes %s column %d %v",
						name, ErrNonFinite, k, s.upos[u], what, col, v)
				}
			}
		}
	}
	newRows := 0
	for _, sl := range s.slots {
		if sl < 0 {
			newRows++
		}
	}
	if uint64(t.rows.n)+uint64(newRows) >= math.MaxUint32 {
		return fmt.Errorf("table %q: %w: %d rows plus %d new would pass %d", name, ErrTableFull, t.rows.n, newRows, uint32(math.MaxUint32-1))
	}

	// Commit. Only the used words: padding stays as the slab made it, zero.
	used := l.hdr + dim*(1+l.slots)
	t.mu.Lock()
	defer t.mu.Unlock()
	for u, sl := range s.slots {
		st := s.stage[u*stride : u*stride+used]
		if sl >= 0 {
			slot := uint32(sl)
			row := t.rows.row(slot)
			for _, v := range t.views {
				v.preserve(slot, row)
			}
			copy(row[:used], st)
			continue
		}
		slot := t.rows.add()
		copy(t.rows.row(slot)[:used], st)
		t.ix.insert(hashKey(s.ukeys[u]), slot)
	}
	return nil
}

// Check returns the error Apply would return for a malformed batch (a length
// mismatch, a NaN or Inf gradient) without applying it or taking a lock. A
// batch that passes may still be rejected by Apply if a sum or an update
// overflows.
func (t *Table) Check(keys []uint64, grads []float32) error {
	if err := t.checkLen(keys, grads); err != nil {
		return err
	}
	if !allFinite(grads) {
		return t.nonFiniteGradient(keys, grads)
	}
	return nil
}

func (t *Table) checkLen(keys []uint64, grads []float32) error {
	if dim := t.cfg.Dim; len(grads) != len(keys)*dim {
		return fmt.Errorf("table %q: %w: %d gradient values for %d keys of dim %d (want %d)",
			t.cfg.Name, ErrDimMismatch, len(grads), len(keys), dim, len(keys)*dim)
	}
	return nil
}

// nonFiniteGradient builds the error for a batch whose summed gradients are
// not all finite: the first NaN or Inf gradient if there is one, else the
// first sum that overflowed.
// Only a holder of writeMu may call it when grads are all finite (it then
// reads the scratch sums).
func (t *Table) nonFiniteGradient(keys []uint64, grads []float32) error {
	dim, name, s := t.cfg.Dim, t.cfg.Name, &t.scratch
	for p, g := range grads {
		if isNonFinite(g) {
			return fmt.Errorf("table %q: %w: gradient of key %d (position %d) column %d is %v",
				name, ErrNonFinite, keys[p/dim], p/dim, p%dim, g)
		}
	}
	for u := range s.ukeys {
		for c, g := range s.gsum[u*dim : (u+1)*dim] {
			if isNonFinite(g) {
				return fmt.Errorf("table %q: %w: summed gradient of key %d (first at position %d) column %d is %v",
					name, ErrNonFinite, s.ukeys[u], s.upos[u], c, g)
			}
		}
	}
	panic("store: nonFiniteGradient called on finite gradients")
}

// allFinite reports whether no value is NaN or ±Inf. It reads two values a
// word and branches once at the end: per 32-bit lane, exponent bits all ones
// (0x7f800000) plus 0x00800000 carries into the lane's top bit, and lanes
// cannot carry into each other because a masked lane is at most 0x7f800000.
func allFinite(v []float32) bool {
	const exp, one, top = 0x7f8000007f800000, 0x0080000000800000, 0x8000000080000000
	var acc uint64
	if len(v) > 0 && uintptr(unsafe.Pointer(&v[0]))&7 != 0 { // caller's subslice: align
		acc |= uint64(finiteBits(v[0]))
		v = v[1:]
	}
	if len(v) >= 2 {
		w := unsafe.Slice((*uint64)(unsafe.Pointer(&v[0])), len(v)/2)
		for _, x := range w {
			acc |= (x & exp) + one
		}
	}
	if len(v)&1 == 1 {
		acc |= uint64(finiteBits(v[len(v)-1]))
	}
	return acc&top == 0
}

func isNonFinite(f float32) bool {
	// Exponent all ones: Inf or NaN.
	return math.Float32bits(f)&0x7f800000 == 0x7f800000
}
