package replication

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"go.etcd.io/bbolt"
)

func openTestNodeLog(t *testing.T, root string) *NodeLog {
	t.Helper()
	l, err := OpenNodeLog(NodeLogConfig{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func testEntry(i uint64) *raft.Log {
	return &raft.Log{Index: i, Term: i / 3, Type: raft.LogCommand, Data: bytes.Repeat([]byte{byte(i)}, int(i%7)), AppendedAt: time.Unix(0, int64(i)*1000)}
}

// The shared log is a raft.LogStore and StableStore with raft-boltdb's
// semantics: entries round-trip, DeleteRange trims, stable keys persist
// across a reopen.
func TestNodeLogStore(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "groups", "t", "0")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	l := openTestNodeLog(t, root)
	g, err := l.openGroup(dir)
	if err != nil {
		t.Fatal(err)
	}
	var logs []*raft.Log
	for i := uint64(1); i <= 20; i++ {
		logs = append(logs, testEntry(i))
	}
	if err := g.StoreLogs(logs); err != nil {
		t.Fatal(err)
	}
	if err := g.DeleteRange(1, 5); err != nil {
		t.Fatal(err)
	}
	if err := g.SetUint64([]byte("CurrentTerm"), 7); err != nil {
		t.Fatal(err)
	}
	if _, err := g.Get([]byte("LastVoteCand")); err == nil || err.Error() != "not found" {
		t.Fatalf("Get of a missing key: %v, want raft's \"not found\"", err)
	}
	if _, err := l.openGroup(dir); err == nil {
		t.Fatal("a log opened twice")
	}
	g.Close()
	l.Close()

	l = openTestNodeLog(t, root)
	g, err = l.openGroup(dir)
	if err != nil {
		t.Fatal(err)
	}
	first, _ := g.FirstIndex()
	last, _ := g.LastIndex()
	if first != 6 || last != 20 {
		t.Fatalf("first, last = %d, %d; want 6, 20", first, last)
	}
	for i := uint64(6); i <= 20; i++ {
		var got raft.Log
		if err := g.GetLog(i, &got); err != nil {
			t.Fatal(err)
		}
		want := testEntry(i)
		if got.Index != want.Index || got.Term != want.Term || got.Type != want.Type || !bytes.Equal(got.Data, want.Data) || !got.AppendedAt.Equal(want.AppendedAt) {
			t.Fatalf("entry %d = %+v, want %+v", i, got, *want)
		}
	}
	var got raft.Log
	if err := g.GetLog(3, &got); !errors.Is(err, raft.ErrLogNotFound) {
		t.Fatalf("deleted entry: %v", err)
	}
	if v, err := g.GetUint64([]byte("CurrentTerm")); err != nil || v != 7 {
		t.Fatalf("CurrentTerm = %d, %v", v, err)
	}
}

// Writes queued while the writer commits go out together in its next
// transaction: group commit without a timer.
func TestNodeLogGroupCommit(t *testing.T) {
	root := t.TempDir()
	l := openTestNodeLog(t, root)
	const groups = 8
	var gls []*groupLog
	for i := range groups {
		dir := filepath.Join(root, "g", string(rune('a'+i)))
		os.MkdirAll(dir, 0o755)
		g, err := l.openGroup(dir)
		if err != nil {
			t.Fatal(err)
		}
		gls = append(gls, g)
	}
	release := make(chan struct{})
	started := make(chan struct{})
	go l.write(func(*bbolt.Tx) error { close(started); <-release; return nil })
	<-started
	c0, _ := l.Stats()
	var wg sync.WaitGroup
	for i, g := range gls {
		wg.Go(func() {
			if err := g.StoreLogs([]*raft.Log{testEntry(uint64(i + 1))}); err != nil {
				t.Error(err)
			}
		})
	}
	for {
		l.mu.Lock()
		n := len(l.queue)
		l.mu.Unlock()
		if n == groups {
			break
		}
		time.Sleep(time.Millisecond)
	}
	close(release)
	wg.Wait()
	c1, _ := l.Stats()
	// The blocked transaction, then one for all eight groups.
	if c1-c0 != 2 {
		t.Fatalf("%d commits for a blocked one and %d queued appends, want 2", c1-c0, groups)
	}
}

// A replica directory deleted, or set aside, takes its records with it: a
// replica opened in its place starts empty with a new ID (it never sees
// the old entries), and Sweep deletes the old records.
func TestNodeLogIncarnations(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "groups", "t", "0")
	os.MkdirAll(dir, 0o755)
	l := openTestNodeLog(t, root)
	g, err := l.openGroup(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.StoreLogs([]*raft.Log{testEntry(1), testEntry(2)}); err != nil {
		t.Fatal(err)
	}
	if n, err := l.Sweep(); err != nil || n != 0 {
		t.Fatalf("Sweep with the replica open: %d, %v", n, err)
	}
	g.Close()
	if n, err := l.Sweep(); err != nil || n != 0 {
		t.Fatalf("Sweep with the replica closed but present: %d, %v", n, err)
	}
	oldID := g.id
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(dir, 0o755)
	g, err = l.openGroup(dir)
	if err != nil {
		t.Fatal(err)
	}
	if g.id == oldID {
		t.Fatalf("a new replica got the old ID %d", oldID)
	}
	if last, _ := g.LastIndex(); last != 0 {
		t.Fatalf("a new replica sees entries up to %d", last)
	}
	if n, err := l.Sweep(); err != nil || n != 1 {
		t.Fatalf("Sweep after the directory went: %d, %v; want 1", n, err)
	}
	g.Close()
}

// A replica whose ID names no records (the shared file was set aside) is
// a corrupt replica, for its node to set aside: never an empty log that
// would let a voter forget its vote and entries.
func TestNodeLogMissingRecords(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "groups", "t", "0")
	os.MkdirAll(dir, 0o755)
	l, err := OpenNodeLog(NodeLogConfig{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	g, err := l.openGroup(dir)
	if err != nil {
		t.Fatal(err)
	}
	g.Close()
	l.Close()
	if err := os.Remove(filepath.Join(root, NodeLogFile)); err != nil {
		t.Fatal(err)
	}
	l = openTestNodeLog(t, root)
	if _, err := l.openGroup(dir); !errors.Is(err, ErrCorruptReplica) {
		t.Fatalf("open with the records gone: %v, want ErrCorruptReplica", err)
	}
}

// A shared file that fails its check is refused with ErrCorruptReplica
// (the node sets it aside), never opened or a crash.
func TestNodeLogCorruptFile(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "g")
	os.MkdirAll(dir, 0o755)
	l, err := OpenNodeLog(NodeLogConfig{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	g, _ := l.openGroup(dir)
	g.StoreLogs([]*raft.Log{testEntry(1)})
	g.Close()
	l.Close()
	path := filepath.Join(root, NodeLogFile)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2*4096 && i < len(b); i++ { // both meta pages
		b[i] ^= 0x5a
	}
	os.WriteFile(path, b, 0o600)
	if _, err := OpenNodeLog(NodeLogConfig{Root: root}); !errors.Is(err, ErrCorruptReplica) {
		t.Fatalf("open of a corrupt shared log: %v, want ErrCorruptReplica", err)
	}
}

func FuzzDecodeLogRecord(f *testing.F) {
	f.Add(encodeLogRecord(testEntry(9)))
	f.Add(encodeLogRecord(&raft.Log{Extensions: []byte("rpsC1234"), Data: []byte("x")}))
	f.Fuzz(func(t *testing.T, v []byte) {
		var l raft.Log
		if err := decodeLogRecord(v, &l); err != nil {
			return
		}
		if !bytes.Equal(encodeLogRecord(&l), v) {
			t.Fatalf("round trip differs")
		}
	})
}
