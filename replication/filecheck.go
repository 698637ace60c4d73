package replication

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"os"
	"runtime/debug"
	"syscall"

	"go.etcd.io/bbolt"
)

// Bad files: a replica whose files cannot be trusted must be set aside and
// rebuilt from its peers, never crash the node. bbolt (v1.3.5) cannot be
// trusted to say so itself:
//
//   - With NoFreelistSync, Open rebuilds the freelist by walking every page
//     reachable from the root, and reports a bad page by panicking in a
//     goroutine of its own (DB.freepages): no recover of the caller's can
//     stop that from ending the process.
//   - The file is memory-mapped, and a file truncated below its high-water
//     mark faults (SIGBUS) on the first read of a page past its end, which
//     Go turns into a fatal error, not a panic.
//   - A byte flipped in a branch or leaf page can send a cursor out of the
//     page (an index panic) or to a page that is not one.
//
// So CheckBoltFile reads the file with pread, never through a mapping, and
// walks the same pages bbolt would, checking each before it follows it; and
// Contain runs the opens that follow with faults turned into panics and
// panics into ErrCorruptReplica. The check reads every page in use once, the
// cost of bbolt's own freelist scan at open.

// The on-disk layout of bbolt v1.3.5 (page.go, db.go, bucket.go), native
// (little-endian) byte order.
const (
	boltMagic          = 0xED0CDAED
	boltVersion        = 2
	boltPageHeader     = 16 // id u64 | flags u16 | count u16 | overflow u32
	boltElementSize    = 16 // branch: pos, ksize u32, pgid u64; leaf: flags, pos, ksize, vsize u32
	boltBucketHeader   = 16 // root pgid u64 | sequence u64
	boltMetaChecksumAt = 56 // bytes of the meta that its checksum covers
	boltBranchPage     = 0x01
	boltLeafPage       = 0x02
	boltFreelistPage   = 0x10
	boltBucketLeaf     = 0x01
	boltNoFreelist     = ^uint64(0)
	// boltMaxPageSize bounds the page size a meta page may claim, so that a
	// corrupt one cannot make the check allocate without limit.
	boltMaxPageSize = 1 << 20
)

// boltMeta is the part of a meta page the check needs.
type boltMeta struct {
	pageSize uint32
	root     uint64
	freelist uint64
	pgid     uint64 // high-water mark: pages [0, pgid) are in use or free
	txid     uint64
}

func parseBoltMeta(page []byte) (boltMeta, error) {
	var m boltMeta
	if len(page) < boltPageHeader+boltMetaChecksumAt+8 {
		return m, errors.New("meta page is short")
	}
	b := page[boltPageHeader:]
	le := binary.LittleEndian
	if le.Uint32(b[0:]) != boltMagic {
		return m, errors.New("meta page has no bolt magic")
	}
	if v := le.Uint32(b[4:]); v != boltVersion {
		return m, fmt.Errorf("meta page has version %d, want %d", v, boltVersion)
	}
	h := fnv.New64a()
	h.Write(b[:boltMetaChecksumAt])
	if sum := le.Uint64(b[boltMetaChecksumAt:]); sum != 0 && sum != h.Sum64() {
		return m, errors.New("meta page fails its checksum")
	}
	m.pageSize = le.Uint32(b[8:])
	m.root = le.Uint64(b[16:])
	m.freelist = le.Uint64(b[32:])
	m.pgid = le.Uint64(b[40:])
	m.txid = le.Uint64(b[48:])
	return m, nil
}

// CheckBoltFile checks the bbolt file at path before it is opened: both
// meta pages valid, the file as long as its high-water mark says, and
// every page reachable from the root a branch or leaf page inside the
// file, referenced once, whose elements lie inside it, with keys in order.
// A missing or empty file passes (bbolt creates it). A failure wraps
// ErrCorruptReplica; an error reading the file does not.
//
// Both meta pages must be valid, though bbolt would fall back to the
// older one: for a Raft log or stable store the transaction it would lose
// may hold an entry or a vote already acknowledged, so the replica is
// rebuilt instead.
func CheckBoltFile(path string) (err error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return err
	}
	if info.Size() == 0 {
		return nil
	}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%s: %w: %s", path, ErrCorruptReplica, fmt.Sprintf(format, args...))
	}
	// A slice index the checks below missed is a corrupt file too.
	defer func() {
		if p := recover(); p != nil {
			err = bad("checking its pages: %v", p)
		}
	}()
	first := make([]byte, 4096)
	if _, err := f.ReadAt(first, 0); err != nil {
		if errors.Is(err, io.EOF) {
			return bad("%d bytes, shorter than a meta page", info.Size())
		}
		return err
	}
	m0, err := parseBoltMeta(first)
	if err != nil {
		return bad("meta page 0: %v", err)
	}
	ps := int64(m0.pageSize)
	if ps < 512 || ps > boltMaxPageSize || ps&(ps-1) != 0 {
		return bad("meta page 0 gives page size %d", ps)
	}
	c := &boltChecker{f: f, size: info.Size(), pageSize: ps, bad: bad, seen: map[uint64]bool{0: true, 1: true}}
	p1, err := c.read(1, 0)
	if err != nil {
		return err
	}
	m1, err := parseBoltMeta(p1)
	if err != nil {
		return bad("meta page 1: %v", err)
	}
	m := m0
	if m1.txid > m0.txid {
		m = m1
	}
	if m.pageSize != m0.pageSize {
		return bad("meta pages disagree on the page size (%d, %d)", m0.pageSize, m1.pageSize)
	}
	if m.pgid < 2 || m.pgid > uint64(info.Size()/ps) {
		return bad("high-water mark is page %d but the file holds %d pages of %d bytes (truncated?)", m.pgid, info.Size()/ps, ps)
	}
	c.hwm = m.pgid
	if m.freelist != boltNoFreelist {
		if err := c.page(m.freelist, boltFreelistPage); err != nil {
			return err
		}
	}
	return c.bucket(m.root, nil)
}

// boltChecker walks one file's pages.
type boltChecker struct {
	f        *os.File
	size     int64
	pageSize int64
	hwm      uint64
	seen     map[uint64]bool
	bad      func(format string, args ...any) error
}

// read reads page id and its overflow pages; overflow is how many.
func (c *boltChecker) read(id uint64, overflow uint32) ([]byte, error) {
	n := (int64(overflow) + 1) * c.pageSize
	off := int64(id) * c.pageSize
	if off < 0 || off+n > c.size {
		return nil, c.bad("page %d (+%d overflow) lies past the end of the file", id, overflow)
	}
	buf := make([]byte, n)
	if _, err := c.f.ReadAt(buf, off); err != nil {
		return nil, err
	}
	return buf, nil
}

// bucket checks the tree of a bucket whose root is page root, or whose
// inline page is inline (root 0).
func (c *boltChecker) bucket(root uint64, inline []byte) error {
	if root == 0 {
		if len(inline) < boltPageHeader {
			return c.bad("inline bucket of %d bytes", len(inline))
		}
		return c.elements(inline, "inline bucket")
	}
	return c.page(root, boltBranchPage|boltLeafPage)
}

// page checks page id, which must be of one of the kinds in want, and the
// pages below it.
func (c *boltChecker) page(id uint64, want uint16) error {
	if id < 2 || id >= c.hwm {
		return c.bad("reference to page %d, outside [2, %d)", id, c.hwm)
	}
	head, err := c.read(id, 0)
	if err != nil {
		return err
	}
	le := binary.LittleEndian
	if got := le.Uint64(head); got != id {
		return c.bad("page %d says it is page %d", id, got)
	}
	flags, overflow := le.Uint16(head[8:]), le.Uint32(head[12:])
	if flags&want == 0 {
		return c.bad("page %d has type flags %#x, want %#x", id, flags, want)
	}
	if id+uint64(overflow) >= c.hwm {
		return c.bad("page %d overflows %d pages past the high-water mark %d", id, overflow, c.hwm)
	}
	for i := uint64(0); i <= uint64(overflow); i++ {
		if c.seen[id+i] {
			return c.bad("page %d is referenced twice", id+i)
		}
		c.seen[id+i] = true
	}
	if flags&boltFreelistPage != 0 {
		return nil
	}
	buf := head
	if overflow > 0 {
		if buf, err = c.read(id, overflow); err != nil {
			return err
		}
	}
	return c.elements(buf, fmt.Sprintf("page %d", id))
}

// elements checks the elements of a branch or leaf page held in p and
// follows their children.
func (c *boltChecker) elements(p []byte, what string) error {
	le := binary.LittleEndian
	flags, count := le.Uint16(p[8:]), int(le.Uint16(p[10:]))
	if flags&(boltBranchPage|boltLeafPage) == 0 {
		return c.bad("%s has type flags %#x, not a branch or leaf", what, flags)
	}
	if boltPageHeader+count*boltElementSize > len(p) {
		return c.bad("%s claims %d elements, more than it holds", what, count)
	}
	if flags&boltBranchPage != 0 && count == 0 {
		return c.bad("%s is an empty branch", what)
	}
	var prev []byte
	for i := range count {
		at := boltPageHeader + i*boltElementSize
		e := p[at : at+boltElementSize]
		var key, val []byte
		var child uint64
		leafFlags := uint32(0)
		if flags&boltBranchPage != 0 {
			pos, ksize := int(le.Uint32(e[0:])), int(le.Uint32(e[4:]))
			if at+pos+ksize > len(p) || pos < 0 {
				return c.bad("%s element %d: key past the page end", what, i)
			}
			key, child = p[at+pos:at+pos+ksize], le.Uint64(e[8:])
		} else {
			leafFlags = le.Uint32(e[0:])
			pos, ksize, vsize := int(le.Uint32(e[4:])), int(le.Uint32(e[8:])), int(le.Uint32(e[12:]))
			if pos < 0 || ksize < 0 || vsize < 0 || at+pos+ksize+vsize > len(p) {
				return c.bad("%s element %d: key or value past the page end", what, i)
			}
			key, val = p[at+pos:at+pos+ksize], p[at+pos+ksize:at+pos+ksize+vsize]
		}
		if i > 0 && bytes.Compare(prev, key) >= 0 {
			return c.bad("%s element %d: keys out of order", what, i)
		}
		prev = key
		switch {
		case flags&boltBranchPage != 0:
			if err := c.page(child, boltBranchPage|boltLeafPage); err != nil {
				return err
			}
		case leafFlags&boltBucketLeaf != 0:
			if len(val) < boltBucketHeader {
				return c.bad("%s element %d: bucket header of %d bytes", what, i, len(val))
			}
			if err := c.bucket(le.Uint64(val), val[boltBucketHeader:]); err != nil {
				return err
			}
		}
	}
	return nil
}

// Contain runs open, which opens a replica's files, so that a corrupt file
// that got past the checks cannot end the process: a memory fault (a
// mapped page past the end of a truncated file) becomes a panic, and a
// panic becomes an error wrapping ErrCorruptReplica. It cannot reach
// goroutines that open starts (see CheckBoltFile for why bbolt's own is
// checked beforehand). Resources open leaves behind when it panics (a file
// descriptor, a mapping) are not released: the replica is set aside, once.
func Contain(what string, open func() error) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%s: %w: panic while opening: %v", what, ErrCorruptReplica, p)
		}
	}()
	return open()
}

// BoltOpenError marks an error of bbolt.Open that says the file is not a
// valid bolt file (bad magic, version or meta checksum) as
// ErrCorruptReplica; other errors (a lock held, no space) pass as they are.
func BoltOpenError(err error) error {
	if errors.Is(err, bbolt.ErrInvalid) || errors.Is(err, bbolt.ErrChecksum) || errors.Is(err, bbolt.ErrVersionMismatch) {
		return fmt.Errorf("%w: %w", ErrCorruptReplica, err)
	}
	return err
}

// IsNoSpace reports whether err is the file system running out of space
// (or of quota): never a sign of a corrupt file.
func IsNoSpace(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}
