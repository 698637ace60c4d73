package replication

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/raft"
)

// SegLogDir is the directory, inside a replica's Dir, of its segment log.
const SegLogDir = "wal"

// segMaxBytes is the size past which appends go to a new segment file: a
// compaction removes whole segments, so this bounds what stays on disk
// behind the log's first index.
var segMaxBytes int64 = 64 << 20

// segHeader is each record's header: the body's length and CRC-32C.
const segHeader = 8

// segBodyFixed is a record body's fixed part: index, term, type,
// appended-at, the batch's length, the data's length and the extensions'
// length. The batch length is set in the first record of each append (the
// bytes of all its records) and zero in the others: at open it tells a
// torn last append (cut) from damage to an append that was acknowledged
// (one that more data follows), which is corruption.
const segBodyFixed = 8 + 8 + 1 + 8 + 4 + 4 + 4

// errSegLogFailed marks a SegLog that failed a write or an fsync: what the
// file holds is unknown from then on (Linux may drop dirty pages after a
// failed fsync and report success to the next one), so every later call
// fails too and the replica has to be reopened, which rereads the file.
var errSegLogFailed = errors.New("segment log failed earlier")

// SegLog is a replica's Raft log and stable store in files of its own: the
// entries in append-only segment files (Dir/wal/<first index>.seg), each
// record framed by its length and CRC-32C, and the stable keys (term, vote)
// in two checksummed slots of one small file, written in turn.
//
// It exists because raft-boltdb spends most of a shard group's write path:
// every StoreLogs is a bolt transaction (B+tree pages, a freelist, the
// entry's msgpack encoding) and two fdatasyncs (data pages, then the meta
// page). Appending a batch here is one encoding into a reused buffer, one
// write and one fdatasync.
//
// Crash safety: a record is in the log when its bytes and CRC are on disk;
// at open the last segment is cut at the first record that is short or
// fails its CRC (a torn append that was never acknowledged), and any other
// damage is ErrCorruptReplica. Truncating the log's tail (raft's conflict
// repair) cuts the file and fsyncs before returning, so removed entries do
// not come back after a crash; removing its head (compaction) deletes
// whole segments only, so after a restart the log may start earlier than
// it did, with entries that were committed anyway.
//
// Concurrency: safe for concurrent use; one mutex serialises appends and
// truncations against reads. Raft appends from one goroutine at a time
// per group, so the mutex only meets its replicators' reads.
type SegLog struct {
	dir    string
	noSync bool

	mu     sync.RWMutex
	segs   []*segment // ascending by first index
	first  uint64     // 0 when the log is empty
	last   uint64
	failed error
	buf    []byte // encoding buffer, reused across appends

	stableMu  sync.Mutex
	stable    map[string][]byte
	stableF   *os.File
	stableSeq uint64
}

type segment struct {
	first   uint64
	f       *os.File
	offsets []int64 // offsets[i] is where entry first+i starts
	size    int64   // end of the last valid record
}

func (s *segment) lastIndex() uint64 { return s.first + uint64(len(s.offsets)) - 1 }

func segName(first uint64) string { return fmt.Sprintf("%020d.seg", first) }

// HasSegLog reports whether dir (a replica's Dir) holds a segment log.
func HasSegLog(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, SegLogDir))
	return err == nil
}

// OpenSegLog opens the segment log under dir/wal, creating it if missing.
// noSync skips fdatasync (tests and benchmarks only, as RaftConfig.NoSync).
func OpenSegLog(dir string, noSync bool) (*SegLog, error) {
	root := filepath.Join(dir, SegLogDir)
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, err
	}
	l := &SegLog{dir: root, noSync: noSync, stable: map[string][]byte{}}
	if err := l.openStable(); err != nil {
		l.Close()
		return nil, err
	}
	names, err := os.ReadDir(root)
	if err != nil {
		return nil, err
	}
	var firsts []uint64
	for _, e := range names {
		name := e.Name()
		if !strings.HasSuffix(name, ".seg") {
			continue
		}
		n, err := strconv.ParseUint(strings.TrimSuffix(name, ".seg"), 10, 64)
		if err != nil || n == 0 {
			return nil, fmt.Errorf("%w: unexpected segment file %s", ErrCorruptReplica, filepath.Join(root, name))
		}
		firsts = append(firsts, n)
	}
	slices.Sort(firsts)
	for i, first := range firsts {
		seg, err := l.openSegment(first, i == len(firsts)-1)
		if err != nil {
			l.Close()
			return nil, err
		}
		if seg == nil {
			continue // an empty last segment, removed
		}
		if n := len(l.segs); n > 0 && l.segs[n-1].lastIndex()+1 != seg.first {
			l.Close()
			seg.f.Close()
			return nil, fmt.Errorf("%w: %s: segment starts at %d but the one before it ends at %d", ErrCorruptReplica, root, seg.first, l.segs[n-1].lastIndex())
		}
		l.segs = append(l.segs, seg)
	}
	if len(l.segs) > 0 {
		l.first, l.last = l.segs[0].first, l.segs[len(l.segs)-1].lastIndex()
	}
	return l, nil
}

// openSegment reads a segment's records and indexes them. In the last
// segment a short or failing record ends the log there (the file is cut);
// elsewhere it is corruption. An empty last segment is removed (nil).
func (l *SegLog) openSegment(first uint64, isLast bool) (*segment, error) {
	path := filepath.Join(l.dir, segName(first))
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	seg := &segment{first: first, f: f}
	r := bufio.NewReaderSize(f, 1<<20)
	var hdr [segHeader]byte
	var body []byte
	var bad error
	var batchStart, batchEnd int64 // the append being read, from its first record
	for {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			if err != io.EOF {
				bad = fmt.Errorf("short record header at offset %d", seg.size)
			}
			break
		}
		n := binary.LittleEndian.Uint32(hdr[0:])
		if n < segBodyFixed || n > MaxRaftMessageBytes {
			bad = fmt.Errorf("record at offset %d claims %d bytes", seg.size, n)
			break
		}
		body = slices.Grow(body[:0], int(n))[:n]
		if _, err := io.ReadFull(r, body); err != nil {
			bad = fmt.Errorf("short record at offset %d", seg.size)
			break
		}
		if crc32.Checksum(body, crc32c) != binary.LittleEndian.Uint32(hdr[4:]) {
			bad = fmt.Errorf("record at offset %d fails its CRC", seg.size)
			break
		}
		if idx, want := binary.LittleEndian.Uint64(body), first+uint64(len(seg.offsets)); idx != want {
			bad = fmt.Errorf("record at offset %d holds entry %d, want %d", seg.size, idx, want)
			break
		}
		if b := binary.LittleEndian.Uint32(body[25:]); b != 0 {
			batchStart, batchEnd = seg.size, seg.size+int64(b)
		}
		seg.offsets = append(seg.offsets, seg.size)
		seg.size += segHeader + int64(n)
	}
	if bad != nil && isLast {
		// Torn only if the bad record is in the file's last append. When it
		// is a later record of an append, that append's first record says
		// where it ends; when it is an append's first record, whatever
		// follows it must not be a valid record.
		fi, err := f.Stat()
		if err != nil {
			f.Close()
			return nil, err
		}
		inBatch := seg.size < batchEnd
		switch {
		case inBatch && batchEnd < fi.Size():
			bad = fmt.Errorf("%v, inside an append that more data follows", bad)
			isLast = false
		case !inBatch && appendStartsAfter(f, seg.size, fi.Size(), first+uint64(len(seg.offsets))-1):
			bad = fmt.Errorf("%v, and a later append follows it", bad)
			isLast = false
		case inBatch:
			// Cut the whole append, not only from the bad record.
			k := sort.Search(len(seg.offsets), func(i int) bool { return seg.offsets[i] >= batchStart })
			seg.offsets, seg.size = seg.offsets[:k], batchStart
		}
	}
	if bad != nil && !isLast {
		f.Close()
		return nil, fmt.Errorf("%w: %s: %v", ErrCorruptReplica, path, bad)
	}
	if bad != nil {
		// A torn append: it was never acknowledged, so it goes.
		if err := f.Truncate(seg.size); err != nil {
			f.Close()
			return nil, fmt.Errorf("cutting the torn tail of %s: %w", path, err)
		}
		if err := l.sync(f); err != nil {
			f.Close()
			return nil, fmt.Errorf("cutting the torn tail of %s: %w", path, err)
		}
	}
	if len(seg.offsets) == 0 {
		f.Close()
		if !isLast {
			return nil, fmt.Errorf("%w: %s: empty segment before others", ErrCorruptReplica, path)
		}
		return nil, os.Remove(path)
	}
	return seg, nil
}

func (l *SegLog) sync(f *os.File) error {
	if l.noSync {
		return nil
	}
	return fdatasync(f)
}

func (l *SegLog) syncDir() error {
	if l.noSync {
		return nil
	}
	d, err := os.Open(l.dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// FirstIndex implements raft.LogStore.
func (l *SegLog) FirstIndex() (uint64, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.first, l.failed
}

// LastIndex implements raft.LogStore.
func (l *SegLog) LastIndex() (uint64, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.last, l.failed
}

// GetLog implements raft.LogStore.
func (l *SegLog) GetLog(index uint64, out *raft.Log) error {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.failed != nil {
		return l.failed
	}
	if l.first == 0 || index < l.first || index > l.last {
		return raft.ErrLogNotFound
	}
	i := sort.Search(len(l.segs), func(i int) bool { return l.segs[i].lastIndex() >= index })
	seg := l.segs[i]
	k := index - seg.first
	start, end := seg.offsets[k], seg.size
	if k+1 < uint64(len(seg.offsets)) {
		end = seg.offsets[k+1]
	}
	rec := make([]byte, end-start)
	if _, err := seg.f.ReadAt(rec, start); err != nil {
		return fmt.Errorf("reading entry %d from %s: %w", index, seg.f.Name(), err)
	}
	if crc32.Checksum(rec[segHeader:], crc32c) != binary.LittleEndian.Uint32(rec[4:]) {
		return fmt.Errorf("%w: entry %d in %s fails its CRC", ErrCorruptReplica, index, seg.f.Name())
	}
	return decodeSegRecord(rec[segHeader:], out)
}

// appendStartsAfter reports whether a valid record that starts an append
// (its batch length set) and holds an entry after last lies anywhere after
// offset off: then the damage at off is in an append that a later one
// followed, so it was acknowledged. Records of the torn append itself may
// survive after its damaged first record (pages reach the disk in any
// order), but none of them starts an append. It reads the rest of the
// file, which is at most a segment.
func appendStartsAfter(f *os.File, off, size int64, last uint64) bool {
	if size-off <= segHeader {
		return false
	}
	b := make([]byte, size-off-1)
	if _, err := f.ReadAt(b, off+1); err != nil && err != io.EOF {
		return false
	}
	for p := 0; p+segHeader+segBodyFixed <= len(b); p++ {
		n := int(binary.LittleEndian.Uint32(b[p:]))
		if n < segBodyFixed || n > len(b)-p-segHeader {
			continue
		}
		body := b[p+segHeader : p+segHeader+n]
		idx := binary.LittleEndian.Uint64(body)
		if idx <= last || idx > last+1<<32 || binary.LittleEndian.Uint32(body[25:]) == 0 {
			continue
		}
		if crc32.Checksum(body, crc32c) == binary.LittleEndian.Uint32(b[p+4:]) {
			return true
		}
	}
	return false
}

func decodeSegRecord(b []byte, out *raft.Log) error {
	if len(b) < segBodyFixed {
		return fmt.Errorf("%w: short log record", ErrCorruptReplica)
	}
	out.Index = binary.LittleEndian.Uint64(b[0:])
	out.Term = binary.LittleEndian.Uint64(b[8:])
	out.Type = raft.LogType(b[16])
	if ns := int64(binary.LittleEndian.Uint64(b[17:])); ns != 0 {
		out.AppendedAt = time.Unix(0, ns)
	} else {
		out.AppendedAt = time.Time{}
	}
	dn := int(binary.LittleEndian.Uint32(b[29:]))
	rest := b[33:]
	if dn > len(rest)-4 {
		return fmt.Errorf("%w: log record %d: data overruns it", ErrCorruptReplica, out.Index)
	}
	out.Data = rest[:dn:dn]
	if dn == 0 {
		out.Data = nil
	}
	rest = rest[dn:]
	en := int(binary.LittleEndian.Uint32(rest))
	if en != len(rest)-4 {
		return fmt.Errorf("%w: log record %d: extensions do not end it", ErrCorruptReplica, out.Index)
	}
	out.Extensions = nil
	if en > 0 {
		out.Extensions = rest[4:]
	}
	return nil
}

func appendSegRecord(buf []byte, e *raft.Log, batch uint32) []byte {
	n := segBodyFixed + len(e.Data) + len(e.Extensions)
	start := len(buf)
	buf = slices.Grow(buf, segHeader+n)[:start+segHeader+n]
	b := buf[start+segHeader:]
	binary.LittleEndian.PutUint64(b[0:], e.Index)
	binary.LittleEndian.PutUint64(b[8:], e.Term)
	b[16] = byte(e.Type)
	var ns int64
	if !e.AppendedAt.IsZero() {
		ns = e.AppendedAt.UnixNano()
	}
	binary.LittleEndian.PutUint64(b[17:], uint64(ns))
	binary.LittleEndian.PutUint32(b[25:], batch)
	binary.LittleEndian.PutUint32(b[29:], uint32(len(e.Data)))
	copy(b[33:], e.Data)
	p := 33 + len(e.Data)
	binary.LittleEndian.PutUint32(b[p:], uint32(len(e.Extensions)))
	copy(b[p+4:], e.Extensions)
	binary.LittleEndian.PutUint32(buf[start:], uint32(n))
	binary.LittleEndian.PutUint32(buf[start+4:], crc32.Checksum(b, crc32c))
	return buf
}

// StoreLog implements raft.LogStore.
func (l *SegLog) StoreLog(e *raft.Log) error { return l.StoreLogs([]*raft.Log{e}) }

// StoreLogs appends entries, which must follow the log's last entry (any
// index starts an empty log), and returns once they are on disk.
func (l *SegLog) StoreLogs(es []*raft.Log) error {
	if len(es) == 0 {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.failed != nil {
		return l.failed
	}
	next := es[0].Index
	if l.first != 0 && next != l.last+1 {
		return fmt.Errorf("segment log %s: appending entry %d after %d", l.dir, next, l.last)
	}
	for i, e := range es {
		if e.Index != next+uint64(i) {
			return fmt.Errorf("segment log %s: entries not consecutive at %d", l.dir, e.Index)
		}
	}
	seg, err := l.active(next)
	if err != nil {
		return err
	}
	// The first record carries the append's length, known before encoding,
	// so every record is encoded and checksummed once.
	total := 0
	for _, e := range es {
		total += segHeader + segBodyFixed + len(e.Data) + len(e.Extensions)
	}
	l.buf = l.buf[:0]
	had := len(seg.offsets)
	for i, e := range es {
		seg.offsets = append(seg.offsets, seg.size+int64(len(l.buf)))
		batch := uint32(0)
		if i == 0 {
			batch = uint32(total)
		}
		l.buf = appendSegRecord(l.buf, e, batch)
	}
	if cap(l.buf) > 4*MaxRaftMessageBytes {
		defer func() { l.buf = nil }()
	}
	if _, err := seg.f.WriteAt(l.buf, seg.size); err != nil {
		// Nothing past seg.size counts: cut what a failed write (a full
		// disk) may have left there, so no stale bytes follow a shorter
		// later append.
		seg.offsets = seg.offsets[:had]
		if terr := seg.f.Truncate(seg.size); terr != nil {
			l.failed = fmt.Errorf("%w: cutting a failed append from %s: %w", errSegLogFailed, seg.f.Name(), terr)
		}
		return fmt.Errorf("segment log %s: writing entries %d-%d: %w", l.dir, next, es[len(es)-1].Index, err)
	}
	if err := l.sync(seg.f); err != nil {
		seg.offsets = seg.offsets[:had]
		l.failed = fmt.Errorf("%w: fsync of %s: %w", errSegLogFailed, seg.f.Name(), err)
		return l.failed
	}
	seg.size += int64(len(l.buf))
	if l.first == 0 {
		l.first = next
	}
	l.last = es[len(es)-1].Index
	return nil
}

// active returns the segment to append entry next to, starting a new one
// when there is none or the last is full.
func (l *SegLog) active(next uint64) (*segment, error) {
	if n := len(l.segs); n > 0 && l.segs[n-1].size < segMaxBytes {
		return l.segs[n-1], nil
	}
	path := filepath.Join(l.dir, segName(next))
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("segment log: %w", err)
	}
	if err := l.syncDir(); err != nil {
		f.Close()
		os.Remove(path)
		return nil, fmt.Errorf("segment log: new segment %s: %w", path, err)
	}
	seg := &segment{first: next, f: f}
	l.segs = append(l.segs, seg)
	return seg, nil
}

// DeleteRange implements raft.LogStore for the two ranges raft deletes: a
// head (compaction after a snapshot) and a tail (a conflicting suffix), or
// the whole log.
func (l *SegLog) DeleteRange(min, max uint64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.failed != nil {
		return l.failed
	}
	if l.first == 0 || max < l.first || min > l.last {
		return nil
	}
	switch {
	case min <= l.first && max >= l.last:
		return l.removeFrom(0)
	case min <= l.first:
		// Whole segments only; entries below the new first stay on disk
		// until their segment goes, and GetLog no longer serves them.
		keep := 0
		for keep < len(l.segs)-1 && l.segs[keep].lastIndex() <= max {
			keep++
		}
		for _, seg := range l.segs[:keep] {
			seg.f.Close()
			if err := os.Remove(seg.f.Name()); err != nil {
				return fmt.Errorf("segment log: %w", err)
			}
		}
		l.segs = slices.Delete(l.segs, 0, keep)
		l.first = max + 1
		return nil
	case max >= l.last:
		i := sort.Search(len(l.segs), func(i int) bool { return l.segs[i].lastIndex() >= min })
		if err := l.removeFrom(i + 1); err != nil {
			return err
		}
		seg := l.segs[i]
		k := min - seg.first
		if k == 0 && i == 0 {
			return l.removeFrom(0)
		}
		if k == 0 {
			return l.removeFrom(i)
		}
		if err := seg.f.Truncate(seg.offsets[k]); err != nil {
			l.failed = fmt.Errorf("%w: truncating %s: %w", errSegLogFailed, seg.f.Name(), err)
			return l.failed
		}
		if err := l.sync(seg.f); err != nil {
			l.failed = fmt.Errorf("%w: fsync of %s: %w", errSegLogFailed, seg.f.Name(), err)
			return l.failed
		}
		seg.size = seg.offsets[k]
		seg.offsets = seg.offsets[:k]
		l.last = min - 1
		return nil
	}
	return fmt.Errorf("segment log %s: deleting %d-%d from the middle of %d-%d", l.dir, min, max, l.first, l.last)
}

// removeFrom deletes segments i and after, newest first, so that a crash
// part way leaves a log that ends earlier, never one with a hole.
func (l *SegLog) removeFrom(i int) error {
	for j := len(l.segs) - 1; j >= i; j-- {
		seg := l.segs[j]
		seg.f.Close()
		if err := os.Remove(seg.f.Name()); err != nil {
			l.failed = fmt.Errorf("%w: %w", errSegLogFailed, err)
			return l.failed
		}
		l.segs = l.segs[:j]
	}
	if err := l.syncDir(); err != nil {
		l.failed = fmt.Errorf("%w: %w", errSegLogFailed, err)
		return l.failed
	}
	if len(l.segs) == 0 {
		l.first, l.last = 0, 0
	} else {
		l.last = l.segs[len(l.segs)-1].lastIndex()
	}
	return nil
}

// Close closes the segment files.
func (l *SegLog) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	var err error
	for _, seg := range l.segs {
		if cerr := seg.f.Close(); err == nil {
			err = cerr
		}
	}
	l.segs = nil
	l.stableMu.Lock()
	if l.stableF != nil {
		if cerr := l.stableF.Close(); err == nil {
			err = cerr
		}
		l.stableF = nil
	}
	l.stableMu.Unlock()
	if l.failed == nil {
		l.failed = errors.New("segment log closed")
	}
	return err
}

// stableFile holds the stable keys in two fixed slots of stableSlot bytes,
// written in turn: each is a sequence number, a length, a CRC-32C of both
// and the keys, and the keys (for each, its length-prefixed name and
// value). At open the valid slot with the higher sequence wins, so a torn
// write leaves the previous keys. The file is written whole once, when the
// log is created; later writes overwrite allocated blocks in place, so a
// term or vote can be saved on a full disk (raft panics when it cannot
// save its term).
const (
	stableFile = "stable"
	stableSlot = 4096
	slotHeader = 8 + 4 + 4
)

func (l *SegLog) openStable() error {
	path := filepath.Join(l.dir, stableFile)
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if errors.Is(err, os.ErrNotExist) {
		if err := WriteFileAtomic(l.dir, stableFile, make([]byte, 2*stableSlot)); err != nil {
			return fmt.Errorf("stable store: %w", err)
		}
		f, err = os.OpenFile(path, os.O_RDWR, 0)
	}
	if err != nil {
		return err
	}
	l.stableF = f
	b := make([]byte, 2*stableSlot)
	if _, err := io.ReadFull(f, b); err != nil {
		return fmt.Errorf("%w: stable store %s: %v", ErrCorruptReplica, path, err)
	}
	var best []byte
	for i := range 2 {
		slot := b[i*stableSlot : (i+1)*stableSlot]
		seq := binary.LittleEndian.Uint64(slot)
		n := binary.LittleEndian.Uint32(slot[8:])
		if seq == 0 || n > stableSlot-slotHeader {
			continue
		}
		h := crc32.Update(crc32.Checksum(slot[:12], crc32c), crc32c, slot[slotHeader:slotHeader+n])
		if h != binary.LittleEndian.Uint32(slot[12:]) || seq <= l.stableSeq {
			continue
		}
		l.stableSeq, best = seq, slot[slotHeader:slotHeader+n]
	}
	if best == nil {
		if !bytesAllZero(b) {
			return fmt.Errorf("%w: stable store %s: neither slot is valid", ErrCorruptReplica, path)
		}
		return nil // created, never written
	}
	for len(best) > 0 {
		var kv [2][]byte
		for j := range kv {
			if len(best) < 4 || int(binary.LittleEndian.Uint32(best)) > len(best)-4 {
				return fmt.Errorf("%w: stable store %s is malformed", ErrCorruptReplica, path)
			}
			n := int(binary.LittleEndian.Uint32(best))
			kv[j], best = best[4:4+n:4+n], best[4+n:]
		}
		l.stable[string(kv[0])] = kv[1]
	}
	return nil
}

func bytesAllZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// Set implements raft.StableStore: the keys are written whole into the
// older slot and fdatasynced.
func (l *SegLog) Set(key, val []byte) error {
	l.stableMu.Lock()
	defer l.stableMu.Unlock()
	next := make(map[string][]byte, len(l.stable)+1)
	for k, v := range l.stable {
		next[k] = v
	}
	next[string(key)] = append([]byte(nil), val...)
	keys := make([]string, 0, len(next))
	for k := range next {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	b := make([]byte, slotHeader, stableSlot)
	for _, k := range keys {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(k)))
		b = append(b, k...)
		b = binary.LittleEndian.AppendUint32(b, uint32(len(next[k])))
		b = append(b, next[k]...)
	}
	if len(b) > stableSlot {
		return fmt.Errorf("stable store %s: %d bytes of keys do not fit a %d-byte slot", l.dir, len(b), stableSlot)
	}
	seq := l.stableSeq + 1
	binary.LittleEndian.PutUint64(b, seq)
	binary.LittleEndian.PutUint32(b[8:], uint32(len(b)-slotHeader))
	binary.LittleEndian.PutUint32(b[12:], crc32.Update(crc32.Checksum(b[:12], crc32c), crc32c, b[slotHeader:]))
	if l.stableF == nil {
		return fmt.Errorf("stable store %s: closed", l.dir)
	}
	if _, err := l.stableF.WriteAt(b, int64(seq%2)*stableSlot); err != nil {
		return fmt.Errorf("stable store %s: %w", l.stableF.Name(), err)
	}
	if err := l.sync(l.stableF); err != nil {
		return fmt.Errorf("stable store %s: %w", l.stableF.Name(), err)
	}
	l.stable, l.stableSeq = next, seq
	return nil
}

// errStableNotFound is the error raft expects, by its text, for a key
// never set.
var errStableNotFound = errors.New("not found")

// Get implements raft.StableStore.
func (l *SegLog) Get(key []byte) ([]byte, error) {
	l.stableMu.Lock()
	defer l.stableMu.Unlock()
	v, ok := l.stable[string(key)]
	if !ok {
		return nil, errStableNotFound
	}
	return append([]byte(nil), v...), nil
}

// SetUint64 implements raft.StableStore.
func (l *SegLog) SetUint64(key []byte, val uint64) error {
	return l.Set(key, binary.BigEndian.AppendUint64(nil, val))
}

// GetUint64 implements raft.StableStore.
func (l *SegLog) GetUint64(key []byte) (uint64, error) { return getUint64(l.Get, key) }

// fdatasync flushes f's data (and the size that finds it), not its other
// metadata.
func fdatasync(f *os.File) error { return syscall.Fdatasync(int(f.Fd())) }
