package store

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	"sync"

	"github.com/cespare/xxhash/v2"
)

// Snapshots are copy-on-write per row. Taking one records how many rows exist
// (O(1), under the write lock) and registers a view. The reader walks the rows
// in slot order with a cursor, a block at a time under the read lock. Before an
// Apply overwrites a row the view has not read yet, it copies the old row into
// the view; the reader takes that copy instead of the live row. Rows created
// after the snapshot lie beyond its row count and are not read.
//
// So an Apply waits at most for one block copy (blockBytes) and for copying the
// rows it changes that open views still need; a snapshot costs extra memory
// only for rows changed while it is read, at most one copy of each.

const (
	snapshotMagic   = "RPSTABLE"
	snapshotVersion = 1
	blockBytes      = 256 << 10 // rows per block: as many as fit
	maxBlockBytes   = 64 << 20  // reader's limit on one block
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// view is an open snapshot's claim on a slab. src and n never change; the
// rest is guarded by the table's mu: Apply writes pre and saved under the write
// lock, the snapshot's reader advances cursor under the read lock (it is the
// only goroutine that reads them under the read lock).
type view struct {
	src    *slab
	n      uint32            // rows visible to the snapshot
	cursor uint32            // rows below cursor have been read; they need no preserving
	pre    map[uint32]uint32 // slot in src -> slot in saved
	saved  *slab             // old contents of rows changed before they were read
}

// preserve keeps a copy of row (slot) if the view has yet to read it.
// Caller holds the table's write lock.
func (v *view) preserve(slot uint32, row []float32) {
	if slot >= v.n || slot < v.cursor {
		return
	}
	if _, ok := v.pre[slot]; ok {
		return
	}
	if v.pre == nil {
		v.pre = make(map[uint32]uint32)
		v.saved = newSlab(v.src.l)
	}
	s := v.saved.add()
	copy(v.saved.row(s), row)
	v.pre[slot] = s
}

func (v *view) bytes() int64 {
	if v.saved == nil {
		return 0
	}
	return v.saved.bytes() + int64(len(v.pre))*16
}

// Snapshot is a point-in-time image of a table, read once by WriteTo or
// Checksum while Applies go on. Release it when done; an unreleased snapshot
// makes every later Apply keep copies of the rows it changes.
type Snapshot struct {
	t     *Table
	v     *view
	mu    sync.Mutex // one reader at a time
	read  bool
	freed bool
}

// Snapshot opens a snapshot of the table's current state. It is O(1) and
// may be called while other snapshots are open.
func (t *Table) Snapshot() *Snapshot {
	t.mu.Lock()
	defer t.mu.Unlock()
	v := &view{src: t.rows, n: t.rows.n}
	t.views = append(t.views, v)
	return &Snapshot{t: t, v: v}
}

// Rows returns the number of rows in the snapshot.
func (s *Snapshot) Rows() int { return int(s.v.n) }

// Release ends the snapshot and frees what it kept. It is idempotent.
func (s *Snapshot) Release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.freed {
		return
	}
	s.freed = true
	t := s.t
	t.mu.Lock()
	for i, v := range t.views {
		if v == s.v {
			t.views = append(t.views[:i], t.views[i+1:]...)
			break
		}
	}
	s.v.pre, s.v.saved = nil, nil
	t.mu.Unlock()
}

// each walks the snapshot's rows in blocks, each encoded as little-endian
// stride-word records, and returns the state digest.
func (s *Snapshot) each(fn func(block []byte, rows int) error) (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.freed {
		return 0, ErrSnapshotReleased
	}
	if s.read {
		return 0, errors.New("store: snapshot already read (a Snapshot is read once)")
	}
	s.read = true
	t, v := s.t, s.v
	stride := t.l.stride
	per := max(1, blockBytes/(stride*4))
	buf := make([]byte, 0, per*stride*4)
	d := newDigest(t.cfg, stride)
	for {
		buf = buf[:0]
		t.mu.RLock()
		start := v.cursor
		end := min(v.n, start+uint32(per))
		for slot := start; slot < end; slot++ {
			row := v.src.row(slot)
			if i, ok := v.pre[slot]; ok {
				row = v.saved.row(i)
			}
			buf = appendRowLE(buf, row)
		}
		v.cursor = end
		t.mu.RUnlock()
		if start == end {
			break
		}
		d.addBlock(buf)
		if fn != nil {
			if err := fn(buf, int(end-start)); err != nil {
				return 0, err
			}
		}
	}
	return d.sum(), nil
}

// Checksum reads the snapshot and returns its state digest.
func (s *Snapshot) Checksum() (uint64, error) { return s.each(nil) }

// WriteTo streams the snapshot to w:
//
//	header:  "RPSTABLE" | version u32 | config length u32 | config | rows u64 | stride u32 | crc32c of all before
//	blocks:  nrows u32 (≠ 0) | nrows records of stride little-endian u32 words | crc32c of nrows and records
//	end:     0 u32 | rows u64 | digest u64 | crc32c of rows and digest
//
// A record is the row as stored: key, Adam step, values, optimizer state.
func (s *Snapshot) WriteTo(w io.Writer) (int64, error) {
	cfg, err := s.t.cfg.MarshalBinary()
	if err != nil {
		return 0, err
	}
	var n int64
	write := func(b []byte) error {
		k, err := w.Write(b)
		n += int64(k)
		if err != nil {
			return fmt.Errorf("store: writing snapshot of table %q: %w", s.t.cfg.Name, err)
		}
		return nil
	}
	h := append([]byte(snapshotMagic), make([]byte, 8)...)
	binary.LittleEndian.PutUint32(h[8:], snapshotVersion)
	binary.LittleEndian.PutUint32(h[12:], uint32(len(cfg)))
	h = append(h, cfg...)
	h = binary.LittleEndian.AppendUint64(h, uint64(s.v.n))
	h = binary.LittleEndian.AppendUint32(h, uint32(s.t.l.stride))
	h = binary.LittleEndian.AppendUint32(h, crc32.Checksum(h, castagnoli))
	if err := write(h); err != nil {
		return n, err
	}
	var frame []byte
	sum, err := s.each(func(block []byte, rows int) error {
		frame = binary.LittleEndian.AppendUint32(frame[:0], uint32(rows))
		frame = append(frame, block...)
		frame = binary.LittleEndian.AppendUint32(frame, crc32.Checksum(frame, castagnoli))
		return write(frame)
	})
	if err != nil {
		return n, err
	}
	var tail [4 + 8 + 8 + 4]byte
	binary.LittleEndian.PutUint64(tail[4:], uint64(s.v.n))
	binary.LittleEndian.PutUint64(tail[12:], sum)
	binary.LittleEndian.PutUint32(tail[20:], crc32.Checksum(tail[4:20], castagnoli))
	return n, write(tail[:])
}

// Checksum returns a digest of the table's full state: every row's key,
// values and optimizer state, and the config. It does not depend on the order
// rows were created in, so replicas agree whenever their rows do. It reads a
// snapshot, so Applies go on while it runs; the digest is of the state when it
// was called.
func (t *Table) Checksum() uint64 {
	s := t.Snapshot()
	defer s.Release()
	sum, err := s.Checksum()
	if err != nil {
		panic("store: checksum of a fresh snapshot failed: " + err.Error())
	}
	return sum
}

// digest sums a 64-bit hash of every row record (so row order does not
// matter) and mixes in the row count and config.
type digest struct {
	acc, rows uint64
	cfg       uint64
	rec       int // bytes per record
}

func newDigest(cfg TableConfig, stride int) digest {
	b, _ := cfg.MarshalBinary()
	return digest{cfg: xxhash.Sum64(b), rec: stride * 4}
}

func (d *digest) addBlock(b []byte) {
	for ; len(b) >= d.rec; b = b[d.rec:] {
		d.acc += xxhash.Sum64(b[:d.rec])
		d.rows++
	}
}

func (d *digest) sum() uint64 { return fmix64(d.acc ^ fmix64(d.rows) ^ fmix64(d.cfg+1)) }

var littleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

func appendRowLE(b []byte, row []float32) []byte {
	if littleEndian {
		return append(b, rowBytes(row)...)
	}
	for _, f := range row {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(f))
	}
	return b
}

// Load reads a snapshot stream into a new table. It checks every checksum and
// that the rows describe a valid state (no duplicate key, finite values and
// state, zero padding); on any error it returns ErrCorruptSnapshot or
// ErrSnapshotVersion wrapped with what was wrong, and nothing else is touched.
func Load(r io.Reader) (*Table, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	corrupt := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrCorruptSnapshot, fmt.Sprintf(format, args...))
	}
	read := func(b []byte, what string) error {
		if _, err := io.ReadFull(br, b); err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
				return corrupt("truncated in %s", what)
			}
			return fmt.Errorf("store: reading snapshot %s: %w", what, err)
		}
		return nil
	}
	head := make([]byte, 16)
	if err := read(head, "header"); err != nil {
		return nil, err
	}
	if string(head[:8]) != snapshotMagic {
		return nil, corrupt("not a table snapshot (magic %q)", head[:8])
	}
	if v := binary.LittleEndian.Uint32(head[8:]); v != snapshotVersion {
		return nil, fmt.Errorf("%w: version %d (this build reads %d)", ErrSnapshotVersion, v, snapshotVersion)
	}
	cfgLen := binary.LittleEndian.Uint32(head[12:])
	if cfgLen > 1024 {
		return nil, corrupt("config length %d", cfgLen)
	}
	head = append(head, make([]byte, cfgLen+8+4+4)...)
	if err := read(head[16:], "header"); err != nil {
		return nil, err
	}
	body := head[:len(head)-4]
	if got, want := crc32.Checksum(body, castagnoli), binary.LittleEndian.Uint32(head[len(head)-4:]); got != want {
		return nil, corrupt("header checksum %08x, computed %08x", want, got)
	}
	var cfg TableConfig
	if err := cfg.UnmarshalBinary(body[16 : 16+cfgLen]); err != nil {
		return nil, corrupt("config: %v", err)
	}
	rows := binary.LittleEndian.Uint64(body[16+cfgLen:])
	stride := int(binary.LittleEndian.Uint32(body[16+cfgLen+8:]))
	t, err := NewTable(cfg)
	if err != nil {
		return nil, corrupt("config: %v", err)
	}
	l := t.l
	if stride != l.stride {
		return nil, corrupt("row stride %d, config %s implies %d", stride, cfg, l.stride)
	}
	if rows >= math.MaxUint32 {
		return nil, corrupt("%d rows", rows)
	}
	d := newDigest(cfg, stride)
	rec := stride * 4
	var frame []byte
	var loaded uint64
	row := make([]float32, stride)
	for {
		var nb [4]byte
		if err := read(nb[:], "block header"); err != nil {
			return nil, err
		}
		n := binary.LittleEndian.Uint32(nb[:])
		if n == 0 {
			break
		}
		if uint64(n)*uint64(rec) > maxBlockBytes || loaded+uint64(n) > rows {
			return nil, corrupt("block of %d rows after %d of %d", n, loaded, rows)
		}
		size := 4 + int(n)*rec + 4
		if cap(frame) < size {
			frame = make([]byte, size)
		}
		frame = frame[:size]
		copy(frame, nb[:])
		if err := read(frame[4:], "block"); err != nil {
			return nil, err
		}
		if got, want := crc32.Checksum(frame[:size-4], castagnoli), binary.LittleEndian.Uint32(frame[size-4:]); got != want {
			return nil, corrupt("block at row %d: checksum %08x, computed %08x", loaded, want, got)
		}
		data := frame[4 : size-4]
		d.addBlock(data)
		for ; len(data) > 0; data = data[rec:] {
			for i := range row {
				row[i] = math.Float32frombits(binary.LittleEndian.Uint32(data[4*i:]))
			}
			if err := t.loadRow(row); err != nil {
				return nil, corrupt("row %d: %v", loaded, err)
			}
			loaded++
		}
	}
	var tail [8 + 8 + 4]byte
	if err := read(tail[:], "trailer"); err != nil {
		return nil, err
	}
	if got, want := crc32.Checksum(tail[:16], castagnoli), binary.LittleEndian.Uint32(tail[16:]); got != want {
		return nil, corrupt("trailer checksum %08x, computed %08x", want, got)
	}
	if n := binary.LittleEndian.Uint64(tail[:]); n != rows || loaded != rows {
		return nil, corrupt("header says %d rows, trailer %d, blocks held %d", rows, n, loaded)
	}
	if want, got := binary.LittleEndian.Uint64(tail[8:]), d.sum(); want != got {
		return nil, corrupt("state digest %016x, computed %016x", want, got)
	}
	return t, nil
}

// loadRow adds one decoded record to a table being loaded (not yet shared).
func (t *Table) loadRow(rec []float32) error {
	l := t.l
	k := keyOf(rec)
	for c, v := range rec[l.hdr : l.hdr+l.dim*(1+l.slots)] {
		if isNonFinite(v) {
			return fmt.Errorf("key %d: word %d is %v", k, c, v)
		}
	}
	if pad := l.hdr + l.dim*(1+l.slots); pad < l.stride && math.Float32bits(rec[pad]) != 0 {
		return fmt.Errorf("key %d: non-zero padding", k)
	}
	if t.cfg.Optimizer.Kind == Adam {
		if h := adamHeader(rec); !(h.b1t >= 0 && h.b1t <= 1 && h.b2t >= 0 && h.b2t <= 1) {
			return fmt.Errorf("key %d: Adam bias powers %v, %v outside [0, 1]", k, h.b1t, h.b2t)
		}
	}
	h := hashKey(k)
	if _, dup := t.ix.find(t.rows, k, h); dup {
		return fmt.Errorf("key %d appears twice", k)
	}
	slot := t.rows.add()
	copy(t.rows.row(slot), rec)
	t.ix.insert(h, slot)
	return nil
}

// Restore replaces the table's state with a snapshot stream of a table with
// the same config. The stream is read and checked completely before anything
// changes: on error the table is as it was. Snapshots open on the old state
// stay readable and keep the old state.
func (t *Table) Restore(r io.Reader) error {
	n, err := Load(r)
	if err != nil {
		return fmt.Errorf("table %q: restore: %w", t.cfg.Name, err)
	}
	if n.cfg != t.cfg {
		return fmt.Errorf("table %q: restore: %w: snapshot is of %s, table is %s", t.cfg.Name, ErrConfigMismatch, n.cfg, t.cfg)
	}
	t.writeMu.Lock()
	defer t.writeMu.Unlock()
	t.mu.Lock()
	defer t.mu.Unlock()
	// Open views read their own slab, which nothing will change any more, so
	// they no longer need rows preserved.
	t.rows, t.ix, t.views = n.rows, n.ix, nil
	return nil
}
