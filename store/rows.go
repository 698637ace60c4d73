package store

import (
	"math"
	"math/bits"
	"unsafe"
)

// Row layout, in float32 words:
//
//	[0:2]           key (uint64, read through keyOf)
//	[2:5]           Adam tables only: the row's step count t (uint32), b1^t, b2^t
//	[hdr:hdr+dim]   values
//	[hdr+dim: ...]  optimizer state, slot after slot, dim words each
//	padding to an even stride, always zero
//
// Keeping the key in the row, not in the index, lets the index hold 8 bytes an
// entry and puts the key compare on the cache line the lookup reads anyway.
type layout struct {
	dim, slots int
	hdr        int // words before the values
	stride     int // words per row, even so every key is 8-byte aligned
}

func newLayout(dim int, k OptKind) layout {
	l := layout{dim: dim, slots: k.stateSlots(), hdr: 2}
	if k == Adam {
		l.hdr = 5
	}
	l.stride = l.hdr + dim*(1+l.slots)
	l.stride += l.stride & 1
	return l
}

func (l layout) values(row []float32) []float32 { return row[l.hdr : l.hdr+l.dim] }
func (l layout) state(row []float32) []float32 {
	return row[l.hdr+l.dim : l.hdr+l.dim*(1+l.slots)]
}

func keyOf(row []float32) uint64     { return *(*uint64)(unsafe.Pointer(&row[0])) }
func setKey(row []float32, k uint64) { *(*uint64)(unsafe.Pointer(&row[0])) = k }

// adamHdr overlays words 2..4 of an Adam row.
type adamHdr struct {
	step     uint32
	b1t, b2t float32
}

func adamHeader(row []float32) *adamHdr { return (*adamHdr)(unsafe.Pointer(&row[2])) }

// rowBytes views a row's memory as bytes (little-endian on the machines we run on;
// appendRowLE checks).
func rowBytes(row []float32) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(&row[0])), len(row)*4)
}

func chunkRowsFor(stride int) (uint, int) {
	// About 1 MiB a chunk: big enough that the chunk list stays short, small
	// enough that growing by one chunk is a short allocation under the lock.
	n := max(64, (1<<20)/(stride*4))
	shift := uint(bits.Len(uint(n)) - 1)
	return shift, 1 << shift
}

// slab stores rows in fixed-size chunks. Chunks are []float32 (no pointers, so
// the GC never scans them) and never move once full, so growing the table
// never copies existing rows; only the first chunk grows by doubling, so that
// small tables stay small.
type slab struct {
	l         layout
	shift     uint
	chunkRows int
	chunks    [][]float32
	n         uint32 // rows in use; slots [0, n) are valid
}

func newSlab(l layout) *slab {
	shift, rows := chunkRowsFor(l.stride)
	return &slab{l: l, shift: shift, chunkRows: rows}
}

func (s *slab) row(slot uint32) []float32 {
	c := s.chunks[slot>>s.shift]
	off := int(slot&uint32(s.chunkRows-1)) * s.l.stride
	return c[off : off+s.l.stride : off+s.l.stride]
}

// add appends a row and returns its slot. The new row is zeroed.
func (s *slab) add() uint32 {
	slot := s.n
	ci := int(slot >> s.shift)
	need := (int(slot&uint32(s.chunkRows-1)) + 1) * s.l.stride
	if ci == len(s.chunks) {
		size := s.chunkRows * s.l.stride
		if ci == 0 {
			size = min(size, 16*s.l.stride)
		}
		s.chunks = append(s.chunks, make([]float32, size))
	} else if c := s.chunks[ci]; len(c) < need {
		grown := make([]float32, min(2*len(c), s.chunkRows*s.l.stride))
		copy(grown, c)
		s.chunks[ci] = grown
	}
	s.n++
	return slot
}

func (s *slab) bytes() int64 {
	var b int64
	for _, c := range s.chunks {
		b += int64(cap(c)) * 4
	}
	return b + int64(cap(s.chunks))*24
}

// index maps keys to slots: 256 open-addressing segments with linear probing,
// chosen by the hash's top byte. Each segment grows on its own, so a resize
// rehashes 1/256 of the table (a fraction of a millisecond at 10M rows) instead
// of stalling writers for the whole table.
//
// An entry is fp<<32 | (slot+1), 0 when empty; fp is the low 32 bits of the
// key's hash, from which the probe position is also taken, so a segment can be
// rehashed from its entries alone without touching a row.
type index struct {
	segs [256]segment
}

type segment struct {
	entries []uint64
	used    int
}

const segInitial = 8

func hashKey(k uint64) uint64 { return fmix64(k) }

// find returns key's slot; s holds the rows the index points into.
func (ix *index) find(s *slab, key, h uint64) (uint32, bool) {
	seg := &ix.segs[h>>56]
	if seg.entries == nil {
		return 0, false
	}
	mask := uint32(len(seg.entries) - 1)
	fp := uint32(h)
	for i := fp & mask; ; i = (i + 1) & mask {
		e := seg.entries[i]
		if e == 0 {
			return 0, false
		}
		if uint32(e>>32) == fp {
			slot := uint32(e) - 1
			if keyOf(s.row(slot)) == key {
				return slot, true
			}
		}
	}
}

// locateGroup is find for up to groupSize keys at once: slots[i] gets keys[i]'s
// slot or -1. A lookup costs two dependent cache misses (index entry, then the
// row's key); done one key at a time they do not overlap. Done in passes over a
// group, the misses of different keys are independent loads the CPU issues in
// parallel: hash every key and load its first index entry; then take each
// key's first fingerprint match as its row and load the row's cache lines,
// with no branch on what they hold; then compare keys, in cache by now. The
// return value is only there so the loads are not optimised away.
//
// The middle pass branching on the row's key (find) instead made lookups
// 19 % slower (BenchmarkEngine, rows=1M and 10M, dim 64, six alternated runs:
// docs/BENCHMARKS.md, "Row lookups without a branch on a miss").
func (ix *index) locateGroup(s *slab, keys []uint64, slots []int64) uint64 {
	var hs [groupSize]uint64
	var sink uint64
	keys = keys[:min(len(keys), groupSize)]
	for i, k := range keys {
		h := hashKey(k)
		hs[i] = h
		if e := ix.segs[h>>56].entries; len(e) > 0 {
			sink += e[uint32(h)&uint32(len(e)-1)]
		}
	}
	// Second pass: the first entry whose fingerprint matches names a row
	// (almost always the key's); load its cache lines without looking at
	// them, so no branch waits for a miss and the loads of many keys overlap.
	for i := range keys {
		h := hs[i]
		slots[i] = -1
		e := ix.segs[h>>56].entries
		if len(e) == 0 {
			continue
		}
		mask := uint32(len(e) - 1)
		fp := uint32(h)
		for j := fp & mask; e[j] != 0; j = (j + 1) & mask {
			if uint32(e[j]>>32) == fp {
				slots[i] = int64(uint32(e[j]) - 1)
				break
			}
		}
		if slots[i] >= 0 {
			row := s.row(uint32(slots[i]))
			for w := 0; w < len(row); w += 16 {
				sink += uint64(math.Float32bits(row[w]))
			}
		}
	}
	// Third pass: check each key against its row, now in cache; a
	// fingerprint shared with another key falls back to a full probe.
	for i, k := range keys {
		if slots[i] >= 0 && keyOf(s.row(uint32(slots[i]))) == k {
			continue
		}
		slots[i] = -1
		if slot, ok := ix.find(s, k, hs[i]); ok {
			slots[i] = int64(slot)
		}
	}
	return sink
}

// groupSize keys are located at a time: enough misses in flight to fill the
// CPU's miss buffers, few enough that what they fetched is still in L1.
const groupSize = 64

// insert adds a key known to be absent.
func (ix *index) insert(h uint64, slot uint32) {
	seg := &ix.segs[h>>56]
	if (seg.used+1)*4 > len(seg.entries)*3 {
		seg.grow()
	}
	seg.put(uint64(uint32(h))<<32 | uint64(slot+1))
	seg.used++
}

func (seg *segment) put(e uint64) {
	mask := uint32(len(seg.entries) - 1)
	i := uint32(e>>32) & mask
	for seg.entries[i] != 0 {
		i = (i + 1) & mask
	}
	seg.entries[i] = e
}

func (seg *segment) grow() {
	old := seg.entries
	seg.entries = make([]uint64, max(segInitial, 2*len(old)))
	for _, e := range old {
		if e != 0 {
			seg.put(e)
		}
	}
}

func (ix *index) bytes() int64 {
	var b int64
	for i := range ix.segs {
		b += int64(cap(ix.segs[i].entries)) * 8
	}
	return b
}
