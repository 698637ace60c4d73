package replication

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/raftps/raftps/replication/internal/reptest"
)

// copyDir copies a replica's directory (files and subdirectories).
func copyDir(t *testing.T, from, to string) {
	t.Helper()
	err := filepath.WalkDir(from, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(from, p)
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(to, rel), 0o755)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(to, rel), b, 0o600)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// boltRootPage returns the offset and size of the root page of the bolt
// file at path, as its newer meta page names it.
func boltRootPage(t *testing.T, b []byte) (off, size int) {
	t.Helper()
	m0, err := parseBoltMeta(b[:4096])
	if err != nil {
		t.Fatal(err)
	}
	m1, err := parseBoltMeta(b[m0.pageSize:])
	if err != nil {
		t.Fatal(err)
	}
	m := m0
	if m1.txid > m0.txid {
		m = m1
	}
	return int(m.root) * int(m.pageSize), int(m.pageSize)
}

// TestOpenRefusesCorruptFiles: a stopped replica's files are damaged in
// the ways a disk or an operator damages them, one copy each; opening each
// copy fails with ErrCorruptReplica, with the process still running (the
// damage to a bolt page would panic bbolt's freelist scan in a goroutine of
// its own, and the truncation would fault on its mapping). The undamaged
// copy opens and holds every acknowledged push.
func TestOpenRefusesCorruptFiles(t *testing.T) {
	cfg := fastConfig(reptest.SGDTable("t", 4))
	c := newGroupCluster(t, 3, cfg)
	c.leader(5 * time.Second)
	w := reptest.NewWorkload(4)
	runWorkload(t, c, w, 2, 50)
	// A push of a value found nowhere else, to find its entry in the file.
	const marker = float32(1234.5)
	if err := c.push(t.Context(), &Push{Client: 99, Seq: 1, Keys: []uint64{7}, Grads: []float32{marker, marker, marker, marker}}); err != nil {
		t.Fatal(err)
	}
	w.Acknowledge([]uint64{7}, []float32{marker, marker, marker, marker})
	c.waitConverged(5 * time.Second)
	victim := (c.leader(time.Second) + 1) % 3
	c.stop(victim)
	dir := c.dirs[victim]

	open := func(d string) (*Group, error) {
		gc := cfg
		_, tr := raft.NewInmemTransport(raft.ServerAddress("copy"))
		gc.NodeID, gc.Dir, gc.Transport = c.ids[victim], d, tr
		return OpenGroup(gc)
	}
	damage := func(name string, fn func(db []byte) []byte) {
		t.Run(name, func(t *testing.T) {
			d := filepath.Join(t.TempDir(), "copy")
			copyDir(t, dir, d)
			p := filepath.Join(d, "raft.db")
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, fn(b), 0o600); err != nil {
				t.Fatal(err)
			}
			g, err := open(d)
			if err == nil {
				g.Close()
				t.Fatal("a damaged replica opened")
			}
			if !errors.Is(err, ErrCorruptReplica) {
				t.Fatalf("opening a damaged replica: %v, want ErrCorruptReplica", err)
			}
			t.Logf("refused: %v", err)
		})
	}
	damage("root page scrambled", func(b []byte) []byte {
		off, _ := boltRootPage(t, b)
		for i := off; i < off+32; i++ {
			b[i] ^= 0xff
		}
		return b
	})
	damage("truncated to half", func(b []byte) []byte { return b[:len(b)/2] })
	damage("entry data changed", func(b []byte) []byte {
		pat := binary.LittleEndian.AppendUint32(nil, math.Float32bits(marker))
		other := binary.LittleEndian.AppendUint32(nil, math.Float32bits(4321.5))
		if !bytes.Contains(b, pat) {
			t.Fatal("the marker push is not in the file")
		}
		// Still finite, still a valid command: only the checksum tells.
		return bytes.ReplaceAll(b, pat, other)
	})
	damage("meta page checksum", func(b []byte) []byte {
		b[boltPageHeader+20] ^= 0x01 // meta 0's root bucket pgid
		return b
	})

	// The undamaged replica opens and catches up with everything.
	c.start(victim, nil)
	c.waitConverged(5 * time.Second)
	w.Check(t, c.groups[victim].Table())
}

// TestOpenRefusesCorruptSnapshot: a replica whose only snapshot fails its
// CRC does not open.
func TestOpenRefusesCorruptSnapshot(t *testing.T) {
	cfg := fastConfig(reptest.SGDTable("t", 4))
	c := newGroupCluster(t, 1, cfg)
	c.leader(5 * time.Second)
	w := reptest.NewWorkload(4)
	runWorkload(t, c, w, 1, 30)
	if err := c.groups[0].Raft().Snapshot().Error(); err != nil {
		t.Fatal(err)
	}
	c.stop(0)
	states, _ := filepath.Glob(filepath.Join(c.dirs[0], "snapshots", "*", "state.bin"))
	if len(states) != 1 {
		t.Fatalf("want one snapshot, found %v", states)
	}
	b, err := os.ReadFile(states[0])
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0x10
	if err := os.WriteFile(states[0], b, 0o600); err != nil {
		t.Fatal(err)
	}
	gc := cfg
	_, tr := raft.NewInmemTransport(raft.ServerAddress("copy"))
	gc.NodeID, gc.Dir, gc.Transport = c.ids[0], c.dirs[0], tr
	g, err := OpenGroup(gc)
	if err == nil {
		g.Close()
		t.Fatal("a replica with a corrupt snapshot opened")
	}
	if !errors.Is(err, ErrCorruptReplica) {
		t.Fatalf("opening with a corrupt snapshot: %v, want ErrCorruptReplica", err)
	}
}
