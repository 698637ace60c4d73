package chain

import (
	"encoding/binary"
	"errors"
	"path/filepath"
	"slices"
	"testing"

	"github.com/raftps/raftps/replication"
	"go.etcd.io/bbolt"
)

// replayed returns the log's entries after 0, or replay's error.
func replayed(t *testing.T, s *storage) ([][]byte, error) {
	t.Helper()
	var out [][]byte
	err := s.replay(0, func(_ uint64, e []byte) error {
		out = append(out, e)
		return nil
	})
	return out, err
}

// TestStorageChecksums: entries come back as written; a flipped bit in a
// stored entry is ErrCorruptReplica on replay, on a read for the successor
// and on an epoch lookup, never a different entry; a log written before
// checksums is given them on open and reads back the same.
func TestStorageChecksums(t *testing.T) {
	dir := t.TempDir()
	s, _, err := openStorage(dir)
	if err != nil {
		t.Fatal(err)
	}
	entries := [][]byte{append(binary.LittleEndian.AppendUint64(nil, 3), "push a"...), append(binary.LittleEndian.AppendUint64(nil, 3), "push b"...)}
	if err := s.append(1, entries, 0); err != nil {
		t.Fatal(err)
	}
	got, err := replayed(t, s)
	if err != nil || !slices.EqualFunc(got, entries, slices.Equal) {
		t.Fatalf("replay: %q, %v; want %q", got, err, entries)
	}
	if ep, ok, err := s.epochAt(2); ep != 3 || !ok || err != nil {
		t.Fatalf("epochAt(2) = %d, %v, %v", ep, ok, err)
	}
	// Flip a bit of entry 2's command, as a bad disk would.
	if err := s.db.Update(func(tx *bbolt.Tx) error {
		b := tx.Bucket(bucketLog)
		v := append([]byte(nil), b.Get(ixKey(2))...)
		v[entryHeader] ^= 0x04
		return b.Put(ixKey(2), v)
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := replayed(t, s); !errors.Is(err, replication.ErrCorruptReplica) {
		t.Errorf("replay of a flipped entry: %v, want ErrCorruptReplica", err)
	}
	if out, err := s.read(1, 1<<20); !errors.Is(err, replication.ErrCorruptReplica) {
		t.Errorf("read for the successor: %q, %v; want ErrCorruptReplica", out, err)
	}
	if _, _, err := s.epochAt(2); !errors.Is(err, replication.ErrCorruptReplica) {
		t.Errorf("epochAt of a flipped entry: %v, want ErrCorruptReplica", err)
	}
	s.close()

	// A log of the format before checksums: entries as they are, no
	// entryCRC in meta.
	old := filepath.Join(t.TempDir(), "old")
	s, _, err = openStorage(old)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.db.Update(func(tx *bbolt.Tx) error {
		for i, e := range entries {
			if err := tx.Bucket(bucketLog).Put(ixKey(uint64(i+1)), e); err != nil {
				return err
			}
		}
		return tx.Bucket(bucketMeta).Delete(metaEntryCRC)
	}); err != nil {
		t.Fatal(err)
	}
	s.close()
	s, _, err = openStorage(old)
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	got, err = replayed(t, s)
	if err != nil || !slices.EqualFunc(got, entries, slices.Equal) {
		t.Fatalf("replay of an upgraded log: %q, %v; want %q", got, err, entries)
	}
}
