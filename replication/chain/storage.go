package chain

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/raftps/raftps/replication"
	"go.etcd.io/bbolt"
)

// storage is a chain replica's durable state in its Dir:
//
//	chain.db              bbolt, fsync on every commit:
//	  log  bucket:        index (u64 big-endian, so the cursor walks in order) → entry | CRC
//	  meta bucket:        epoch, order, committed, snapIndex, snapEpoch, entryCRC
//	snapshot-<index>      the FSM snapshot (replication.Snapshot's stream) at index
//
// An entry is creation epoch u64 LE | command. meta's snapIndex names the one
// snapshot file in use: a new snapshot is written and renamed into place
// first, and only then does one bbolt transaction switch snapIndex to it and
// delete the log entries it covers, so a crash at any point leaves a
// consistent (snapshot, log) pair.
//
// Every stored entry ends with a CRC-32C of its index and bytes, checked on
// every read: bbolt checks its pages' structure but not a value's bytes, so
// a flipped bit would otherwise be applied, or forwarded down the chain, as
// a different push. A log written before checksums (no entryCRC in meta) is
// given them when it is opened.
//
// Concurrency: bbolt serialises writers and lets readers run beside them;
// every method is safe for concurrent use. The Chain decides the order of
// writes (appends under its applyMu).
type storage struct {
	dir string
	db  *bbolt.DB
}

var (
	bucketLog  = []byte("log")
	bucketMeta = []byte("meta")

	metaEpoch     = []byte("epoch")
	metaOrder     = []byte("order")
	metaCommitted = []byte("committed")
	metaSnapIndex = []byte("snapIndex")
	metaSnapEpoch = []byte("snapEpoch")
	metaEntryCRC  = []byte("entryCRC")
)

var crc32c = crc32.MakeTable(crc32.Castagnoli)

const crcBytes = 4

// sealed returns e with its checksum at index ix appended.
func sealed(ix uint64, e []byte) []byte {
	var k [8]byte
	binary.BigEndian.PutUint64(k[:], ix)
	sum := crc32.Update(crc32.Checksum(k[:], crc32c), crc32c, e)
	return binary.LittleEndian.AppendUint32(append(make([]byte, 0, len(e)+crcBytes), e...), sum)
}

// unsealed checks stored value v of index ix and returns its entry (a
// slice of v).
func unsealed(ix uint64, v []byte) ([]byte, error) {
	if len(v) < crcBytes {
		return nil, fmt.Errorf("%w: chain log entry %d: %d bytes, shorter than its checksum", replication.ErrCorruptReplica, ix, len(v))
	}
	e := v[:len(v)-crcBytes]
	var k [8]byte
	binary.BigEndian.PutUint64(k[:], ix)
	if crc32.Update(crc32.Checksum(k[:], crc32c), crc32c, e) != binary.LittleEndian.Uint32(v[len(e):]) {
		return nil, fmt.Errorf("%w: chain log entry %d fails its checksum", replication.ErrCorruptReplica, ix)
	}
	return e, nil
}

// storedMeta is what chain.db's meta bucket holds.
type storedMeta struct {
	epoch     uint64
	order     []string
	committed uint64
	snapIndex uint64
	snapEpoch uint64
}

const entryHeader = 8 // creation epoch

func entryEpoch(e []byte) uint64 { return binary.LittleEndian.Uint64(e) }

func ixKey(ix uint64) []byte { return binary.BigEndian.AppendUint64(make([]byte, 0, 8), ix) }

func openStorage(dir string) (*storage, storedMeta, error) {
	var m storedMeta
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, m, err
	}
	path := filepath.Join(dir, "chain.db")
	// bbolt panics or faults on some corrupt files instead of answering an
	// error: see replication.CheckBoltFile.
	if err := replication.CheckBoltFile(path); err != nil {
		return nil, m, err
	}
	var db *bbolt.DB
	err := replication.Contain("chain log "+path, func() (err error) {
		db, err = bbolt.Open(path, 0o600, &bbolt.Options{
			// Another process on the same Dir is an error to report, not a
			// lock to wait on.
			Timeout: 2 * time.Second,
			// The log is short (snapshots truncate it) and commits are many:
			// rebuild the freelist on open rather than write it every commit.
			NoFreelistSync: true,
			FreelistType:   bbolt.FreelistMapType,
		})
		return err
	})
	if err != nil {
		return nil, m, fmt.Errorf("opening %s: %w", path, replication.BoltOpenError(err))
	}
	err = db.Update(func(tx *bbolt.Tx) error {
		if _, err := tx.CreateBucketIfNotExists(bucketLog); err != nil {
			return err
		}
		b, err := tx.CreateBucketIfNotExists(bucketMeta)
		if err != nil {
			return err
		}
		m.epoch = getU64(b, metaEpoch)
		m.committed = getU64(b, metaCommitted)
		m.snapIndex = getU64(b, metaSnapIndex)
		m.snapEpoch = getU64(b, metaSnapEpoch)
		if o := b.Get(metaOrder); len(o) > 0 {
			m.order = strings.Split(string(o), "\n")
		}
		if b.Get(metaEntryCRC) != nil {
			return nil
		}
		if err := sealAll(tx.Bucket(bucketLog)); err != nil {
			return err
		}
		return b.Put(metaEntryCRC, []byte{1})
	})
	if err != nil {
		db.Close()
		return nil, m, fmt.Errorf("reading %s: %w", path, err)
	}
	s := &storage{dir: dir, db: db}
	s.removeStaleSnapshots(m.snapIndex)
	return s, m, nil
}

// sealAll gives every entry of a log written before checksums its
// checksum. Snapshots keep such a log short.
func sealAll(b *bbolt.Bucket) error {
	type kv struct {
		k uint64
		v []byte
	}
	var all []kv
	if err := b.ForEach(func(k, v []byte) error {
		ix := binary.BigEndian.Uint64(k)
		all = append(all, kv{ix, sealed(ix, v)})
		return nil
	}); err != nil {
		return err
	}
	for _, e := range all {
		if err := b.Put(ixKey(e.k), e.v); err != nil {
			return err
		}
	}
	return nil
}

func getU64(b *bbolt.Bucket, k []byte) uint64 {
	v := b.Get(k)
	if len(v) != 8 {
		return 0
	}
	return binary.LittleEndian.Uint64(v)
}

func putU64(b *bbolt.Bucket, k []byte, v uint64) error {
	return b.Put(k, binary.LittleEndian.AppendUint64(nil, v))
}

func (s *storage) close() error { return s.db.Close() }

// append writes entries first, first+1, ... and the committed index in one
// fsynced transaction. The committed index rides along rather than getting
// an fsync of its own: a stale one after a crash is safe (it only makes
// entries look dirty for longer and delays compaction).
func (s *storage) append(first uint64, entries [][]byte, committed uint64) error {
	return s.db.Update(func(tx *bbolt.Tx) error {
		b := tx.Bucket(bucketLog)
		var k [8]byte
		for i, e := range entries {
			binary.BigEndian.PutUint64(k[:], first+uint64(i))
			if err := b.Put(k[:], sealed(first+uint64(i), e)); err != nil {
				return err
			}
		}
		return putU64(tx.Bucket(bucketMeta), metaCommitted, committed)
	})
}

// saveConfig records the chain configuration.
func (s *storage) saveConfig(epoch uint64, order []string) error {
	return s.db.Update(func(tx *bbolt.Tx) error {
		b := tx.Bucket(bucketMeta)
		if err := putU64(b, metaEpoch, epoch); err != nil {
			return err
		}
		return b.Put(metaOrder, []byte(strings.Join(order, "\n")))
	})
}

// replay calls fn for each entry above after, in index order, and checks they
// are consecutive.
func (s *storage) replay(after uint64, fn func(ix uint64, e []byte) error) error {
	return s.db.View(func(tx *bbolt.Tx) error {
		c := tx.Bucket(bucketLog).Cursor()
		want := after + 1
		for k, v := c.Seek(ixKey(want)); k != nil; k, v = c.Next() {
			ix := binary.BigEndian.Uint64(k)
			if ix != want {
				return fmt.Errorf("log has entry %d where %d was expected", ix, want)
			}
			e, err := unsealed(ix, v)
			if err != nil {
				return err
			}
			// bbolt's value is valid only inside the transaction.
			if err := fn(ix, append([]byte(nil), e...)); err != nil {
				return err
			}
			want++
		}
		return nil
	})
}

// read returns up to maxBytes of consecutive entries from index from (at
// least one if it exists); none if from is not in the log.
func (s *storage) read(from uint64, maxBytes int) ([][]byte, error) {
	var out [][]byte
	err := s.db.View(func(tx *bbolt.Tx) error {
		c := tx.Bucket(bucketLog).Cursor()
		size, want := 0, from
		for k, v := c.Seek(ixKey(from)); k != nil && binary.BigEndian.Uint64(k) == want; k, v = c.Next() {
			e, err := unsealed(want, v)
			if err != nil {
				return err
			}
			if len(out) > 0 && (size+len(e) > maxBytes || len(out) == MaxForwardEntries) {
				break
			}
			out = append(out, append([]byte(nil), e...))
			size += len(e)
			want++
		}
		return nil
	})
	return out, err
}

// firstIndex returns the lowest index in the log, 0 if it is empty.
func (s *storage) firstIndex() (uint64, error) {
	var ix uint64
	err := s.db.View(func(tx *bbolt.Tx) error {
		if k, _ := tx.Bucket(bucketLog).Cursor().First(); k != nil {
			ix = binary.BigEndian.Uint64(k)
		}
		return nil
	})
	return ix, err
}

// epochAt returns the creation epoch of entry ix, if the log holds it.
func (s *storage) epochAt(ix uint64) (uint64, bool, error) {
	var ep uint64
	var ok bool
	err := s.db.View(func(tx *bbolt.Tx) error {
		v := tx.Bucket(bucketLog).Get(ixKey(ix))
		if v == nil {
			return nil
		}
		e, err := unsealed(ix, v)
		if err != nil || len(e) < entryHeader {
			return err
		}
		ep, ok = entryEpoch(e), true
		return nil
	})
	return ep, ok, err
}

func (s *storage) snapshotPath(ix uint64) string {
	return filepath.Join(s.dir, fmt.Sprintf("snapshot-%020d", ix))
}

// writeSnapshot writes the snapshot at index ix with write (which gets a
// buffered writer) into its file, fsyncing it and the directory.
func (s *storage) writeSnapshot(ix uint64, write func(w io.Writer) error) error {
	tmp, err := s.writeTemp(ix, write)
	if err != nil {
		return err
	}
	return s.promote(tmp, ix)
}

// writeTemp writes a snapshot at index ix into a temporary file and fsyncs
// it; promote then puts it in place. In between, the caller may check it.
func (s *storage) writeTemp(ix uint64, write func(w io.Writer) error) (string, error) {
	tmp := s.snapshotPath(ix) + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return "", fmt.Errorf("writing snapshot %d: %w", ix, err)
	}
	w := bufio.NewWriterSize(f, 1<<20)
	err = write(w)
	if err == nil {
		err = w.Flush()
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("writing snapshot %d: %w", ix, err)
	}
	return tmp, nil
}

// promote renames the temporary file of snapshot ix into place.
func (s *storage) promote(tmp string, ix uint64) error {
	err := os.Rename(tmp, s.snapshotPath(ix))
	if err == nil {
		err = syncDir(s.dir)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("writing snapshot %d: %w", ix, err)
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// useSnapshot switches to the snapshot at ix (already written): in one
// transaction it records it and deletes the log entries at or below
// compactTo, or every entry if reset (the log no longer follows the
// snapshot: a snapshot installed from the predecessor). The previous
// snapshot file is removed afterwards. Unless reset, it does nothing if the
// recorded snapshot is as new: a periodic snapshot that raced an installed
// one must not take the store back.
func (s *storage) useSnapshot(ix, epoch, compactTo uint64, reset bool) error {
	err := s.db.Update(func(tx *bbolt.Tx) error {
		m := tx.Bucket(bucketMeta)
		if cur := getU64(m, metaSnapIndex); !reset && cur >= ix {
			return nil
		}
		if reset {
			if err := tx.DeleteBucket(bucketLog); err != nil {
				return err
			}
			if _, err := tx.CreateBucket(bucketLog); err != nil {
				return err
			}
		} else {
			c := tx.Bucket(bucketLog).Cursor()
			for k, _ := c.First(); k != nil && binary.BigEndian.Uint64(k) <= compactTo; k, _ = c.First() {
				if err := c.Delete(); err != nil {
					return err
				}
			}
		}
		if err := putU64(m, metaSnapIndex, ix); err != nil {
			return err
		}
		return putU64(m, metaSnapEpoch, epoch)
	})
	if err != nil {
		return err
	}
	var cur uint64
	_ = s.db.View(func(tx *bbolt.Tx) error { cur = getU64(tx.Bucket(bucketMeta), metaSnapIndex); return nil })
	s.removeStaleSnapshots(cur)
	return nil
}

// removeStaleSnapshots deletes snapshot files other than keep's: older ones,
// and leftovers of writes or installs a crash interrupted. Failures are
// harmless (the files are ignored) and not reported.
func (s *storage) removeStaleSnapshots(keep uint64) {
	names, err := os.ReadDir(s.dir)
	if err != nil {
		return
	}
	want := filepath.Base(s.snapshotPath(keep))
	for _, n := range names {
		if strings.HasPrefix(n.Name(), "snapshot-") && (keep == 0 || n.Name() != want) {
			os.Remove(filepath.Join(s.dir, n.Name()))
		}
	}
}

// openSnapshot opens the snapshot at ix for reading.
func (s *storage) openSnapshot(ix uint64) (*os.File, error) {
	f, err := os.Open(s.snapshotPath(ix))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("snapshot %d recorded in chain.db is missing: %w", ix, err)
	}
	return f, err
}
