package replication

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

func segEntry(i uint64) *raft.Log {
	return &raft.Log{Index: i, Term: 1 + i/10, Type: raft.LogCommand, Data: []byte(fmt.Sprintf("entry-%d", i)), AppendedAt: time.Unix(0, int64(i))}
}

func storeRange(t *testing.T, l *SegLog, from, to uint64) {
	t.Helper()
	var es []*raft.Log
	for i := from; i <= to; i++ {
		es = append(es, segEntry(i))
	}
	if err := l.StoreLogs(es); err != nil {
		t.Fatalf("StoreLogs %d-%d: %v", from, to, err)
	}
}

// checkRange requires the log to hold exactly first..last, each entry as
// written.
func checkRange(t *testing.T, l *SegLog, first, last uint64) {
	t.Helper()
	if f, _ := l.FirstIndex(); f != first {
		t.Fatalf("FirstIndex %d, want %d", f, first)
	}
	if la, _ := l.LastIndex(); la != last {
		t.Fatalf("LastIndex %d, want %d", la, last)
	}
	if first == 0 {
		return
	}
	for i := first; i <= last; i++ {
		var got raft.Log
		if err := l.GetLog(i, &got); err != nil {
			t.Fatalf("GetLog(%d): %v", i, err)
		}
		want := segEntry(i)
		if got.Index != i || got.Term != want.Term || !bytes.Equal(got.Data, want.Data) || !got.AppendedAt.Equal(want.AppendedAt) || got.Type != want.Type {
			t.Fatalf("GetLog(%d) = %+v, want %+v", i, got, want)
		}
	}
	var e raft.Log
	if err := l.GetLog(first-1, &e); first > 1 && !errors.Is(err, raft.ErrLogNotFound) {
		t.Fatalf("GetLog(%d) below the first: %v", first-1, err)
	}
	if err := l.GetLog(last+1, &e); !errors.Is(err, raft.ErrLogNotFound) {
		t.Fatalf("GetLog(%d) past the last: %v", last+1, err)
	}
}

// openSeg opens the segment log in dir, closed at the test's end.
func openSeg(t *testing.T, dir string) *SegLog {
	t.Helper()
	l, err := OpenSegLog(dir, false)
	if err != nil {
		t.Fatalf("opening %s: %v", dir, err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func reopenSeg(t *testing.T, l *SegLog, dir string) *SegLog {
	t.Helper()
	l.Close()
	return openSeg(t, dir)
}

func TestSegLogAppendReopenTruncate(t *testing.T) {
	old := segMaxBytes
	segMaxBytes = 200 // a few entries per segment
	defer func() { segMaxBytes = old }()
	dir := t.TempDir()
	l := openSeg(t, dir)
	checkRange(t, l, 0, 0)
	storeRange(t, l, 1, 5)
	for i := uint64(6); i <= 30; i++ {
		if err := l.StoreLog(segEntry(i)); err != nil {
			t.Fatal(err)
		}
	}
	checkRange(t, l, 1, 30)
	if segs, _ := filepath.Glob(filepath.Join(dir, SegLogDir, "*.seg")); len(segs) < 3 {
		t.Fatalf("%d segments, want several at 200 bytes each", len(segs))
	}
	if err := l.StoreLog(segEntry(32)); err == nil {
		t.Fatal("an entry after a gap was stored")
	}
	l = reopenSeg(t, l, dir)
	checkRange(t, l, 1, 30)

	// A conflicting tail goes, and stays gone after a reopen.
	if err := l.DeleteRange(23, 30); err != nil {
		t.Fatal(err)
	}
	checkRange(t, l, 1, 22)
	storeRange(t, l, 23, 25)
	l = reopenSeg(t, l, dir)
	checkRange(t, l, 1, 25)

	// Compaction: the head goes from the API at once and from disk by
	// whole segments; after a reopen the log may start earlier, never later.
	if err := l.DeleteRange(1, 17); err != nil {
		t.Fatal(err)
	}
	checkRange(t, l, 18, 25)
	l = reopenSeg(t, l, dir)
	if f, _ := l.FirstIndex(); f > 18 || f == 0 {
		t.Fatalf("after reopen FirstIndex %d, want 1..18", f)
	}
	f, _ := l.FirstIndex()
	checkRange(t, l, f, 25)

	// Deleting everything (a snapshot installed past the log) empties it,
	// and the next entry may have any index.
	if err := l.DeleteRange(f, 25); err != nil {
		t.Fatal(err)
	}
	checkRange(t, l, 0, 0)
	storeRange(t, l, 100, 104)
	l = reopenSeg(t, l, dir)
	checkRange(t, l, 100, 104)
}

func TestSegLogTornTail(t *testing.T) {
	dir := t.TempDir()
	l := openSeg(t, dir)
	storeRange(t, l, 1, 9)
	storeRange(t, l, 10, 10)
	l.Close()
	seg := filepath.Join(dir, SegLogDir, segName(1))
	fi, _ := os.Stat(seg)
	// Cut the last record in half: an append the crash interrupted.
	if err := os.Truncate(seg, fi.Size()-5); err != nil {
		t.Fatal(err)
	}
	l = reopenSeg(t, l, dir)
	checkRange(t, l, 1, 9)
	storeRange(t, l, 10, 11)
	storeRange(t, l, 12, 12)
	l = reopenSeg(t, l, dir)
	checkRange(t, l, 1, 12)

	// A flipped byte in the last record is a torn tail too.
	l.Close()
	fi, _ = os.Stat(seg)
	b, _ := os.ReadFile(seg)
	b[fi.Size()-3] ^= 0xff
	os.WriteFile(seg, b, 0o644)
	l = reopenSeg(t, l, dir)
	checkRange(t, l, 1, 11)
}

func TestSegLogCorruptSegmentRefused(t *testing.T) {
	old := segMaxBytes
	segMaxBytes = 200
	defer func() { segMaxBytes = old }()
	dir := t.TempDir()
	l := openSeg(t, dir)
	storeRange(t, l, 1, 3)
	storeRange(t, l, 4, 30)
	l.Close()
	// A bad byte in a segment that is not the last is lost acknowledged
	// data: the replica must be rebuilt, not silently shortened.
	seg := filepath.Join(dir, SegLogDir, segName(1))
	b, _ := os.ReadFile(seg)
	b[20] ^= 0xff
	os.WriteFile(seg, b, 0o644)
	if _, err := OpenSegLog(dir, false); !errors.Is(err, ErrCorruptReplica) {
		t.Fatalf("open of a damaged segment: %v, want ErrCorruptReplica", err)
	}
}

func TestSegLogStable(t *testing.T) {
	dir := t.TempDir()
	l := openSeg(t, dir)
	if _, err := l.GetUint64([]byte("CurrentTerm")); err == nil || err.Error() != "not found" {
		t.Fatalf("missing key: %v, want raft's \"not found\"", err)
	}
	if err := l.SetUint64([]byte("CurrentTerm"), 7); err != nil {
		t.Fatal(err)
	}
	if err := l.Set([]byte("LastVoteCand"), []byte("n2")); err != nil {
		t.Fatal(err)
	}
	l = reopenSeg(t, l, dir)
	if v, err := l.GetUint64([]byte("CurrentTerm")); err != nil || v != 7 {
		t.Fatalf("CurrentTerm %d, %v", v, err)
	}
	if v, err := l.Get([]byte("LastVoteCand")); err != nil || string(v) != "n2" {
		t.Fatalf("LastVoteCand %q, %v", v, err)
	}
	// Many writes, then the newest slot torn: the one before it wins.
	for term := uint64(8); term <= 20; term++ {
		if err := l.SetUint64([]byte("CurrentTerm"), term); err != nil {
			t.Fatal(err)
		}
	}
	l.Close()
	p := filepath.Join(dir, SegLogDir, stableFile)
	b, _ := os.ReadFile(p)
	if len(b) != 2*stableSlot {
		t.Fatalf("stable file has %d bytes, want %d", len(b), 2*stableSlot)
	}
	newest := int(l.stableSeq%2) * stableSlot
	b[newest+slotHeader+3] ^= 1
	os.WriteFile(p, b, 0o644)
	l = reopenSeg(t, l, dir)
	if v, err := l.GetUint64([]byte("CurrentTerm")); err != nil || v != 19 {
		t.Fatalf("after a torn newest slot CurrentTerm %d, %v, want 19", v, err)
	}
	l.Close()
	// Both slots bad: corrupt.
	b[stableSlot-newest+slotHeader+3] ^= 1
	os.WriteFile(p, b, 0o644)
	if _, err := OpenSegLog(dir, false); !errors.Is(err, ErrCorruptReplica) {
		t.Fatalf("damaged stable file: %v, want ErrCorruptReplica", err)
	}
}

func TestSegLogDamagedAcknowledgedAppend(t *testing.T) {
	dir := t.TempDir()
	l := openSeg(t, dir)
	storeRange(t, l, 1, 5)
	storeRange(t, l, 6, 10)
	l.Close()
	seg := filepath.Join(dir, SegLogDir, segName(1))
	b, _ := os.ReadFile(seg)
	// Damage entry 3's data: inside the first append, which the second
	// follows, so it was acknowledged: corruption, not a torn tail.
	rec := bytes.Index(b, []byte("entry-3"))
	b[rec] ^= 0xff
	os.WriteFile(seg, b, 0o644)
	if _, err := OpenSegLog(dir, false); !errors.Is(err, ErrCorruptReplica) {
		t.Fatalf("open: %v, want ErrCorruptReplica", err)
	}
	// The same damage in the last append is a torn append: the whole
	// append (6-10) goes, the one before it stays.
	b[rec] ^= 0xff
	b[bytes.Index(b, []byte("entry-8"))] ^= 0xff
	os.WriteFile(seg, b, 0o644)
	l = reopenSeg(t, l, dir)
	checkRange(t, l, 1, 5)
}

// TestSegLogDamagedAppendHeader: the damage hits the header of an append's
// first record, so its length cannot lead to the next record; the later
// appends are found by scanning, and it is corruption. Damage to the
// header of the file's last append is a torn append.
func TestSegLogDamagedAppendHeader(t *testing.T) {
	dir := t.TempDir()
	l := openSeg(t, dir)
	storeRange(t, l, 1, 5)
	storeRange(t, l, 6, 10)
	storeRange(t, l, 11, 15)
	off6 := l.segs[0].offsets[5]
	off11 := l.segs[0].offsets[10]
	l.Close()
	seg := filepath.Join(dir, SegLogDir, segName(1))
	b, _ := os.ReadFile(seg)
	for i := off6; i < off6+4; i++ { // entry 6's length
		b[i] ^= 0x5a
	}
	os.WriteFile(seg, b, 0o644)
	if _, err := OpenSegLog(dir, false); !errors.Is(err, ErrCorruptReplica) {
		t.Fatalf("open with a damaged append header that others follow: %v, want ErrCorruptReplica", err)
	}
	for i := off6; i < off6+4; i++ {
		b[i] ^= 0x5a
	}
	for i := off11; i < off11+4; i++ { // the last append's first length
		b[i] ^= 0x5a
	}
	os.WriteFile(seg, b, 0o644)
	l = reopenSeg(t, l, dir)
	checkRange(t, l, 1, 10)
}
