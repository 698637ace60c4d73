package replication

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	"go.etcd.io/bbolt"
)

// A NodeLog is one bbolt database per node that holds the Raft logs and
// stable state (term, vote) of all the node's shard groups, written with
// group commit: one writer goroutine takes every write queued since its last
// transaction began (the appends, truncations and votes of any number of
// groups) and commits them in one transaction, one pair of fdatasyncs. There
// is no timer: a write that finds the writer idle is committed at once, and
// writes that arrive while it commits wait for the next transaction. With a
// bolt file per group each group paid a commit of its own; under load a
// node's groups now share one (docs/ARCHITECTURE.md, "The shared log").
//
// Layout: a root bucket "groups" holds a bucket per replica, keyed by the
// replica's log ID (8 bytes, big-endian), an ID the database hands out once
// and never again (the root bucket's sequence). The replica's bucket holds
// its directory (relative to the NodeLog's root), a bucket of log records
// keyed by index (big-endian) and a bucket of stable keys. The replica's
// directory holds its ID in the file logIDFile, written after the bucket
// exists: a directory deleted (a dropped table, a replica moved away) or
// set aside takes its ID with it, so a replica opened again in its place
// gets a new ID and an empty log, never the old entries (replica
// incarnations), and Sweep deletes the buckets no directory names.
//
// Records: index u64 | term u64 | type u8 | appended-at unix ns i64 |
// extensions length u32 | extensions | data, little-endian. The entry CRC
// of checkedLogs rides in the extensions as it did with raft-boltdb.
//
// Concurrency: every method is safe for concurrent use. Writes (StoreLogs,
// DeleteRange, Set) are queued to the writer goroutine and return once
// committed; reads run in their own read transactions, concurrently with
// it. A commit that fails for another reason than a full disk fails every
// later write (ErrLogFailed): after a failed fdatasync the kernel may have
// dropped the dirty pages, and a retry that succeeds would report as
// durable what is not. The node must be restarted.
type NodeLog struct {
	db   *bbolt.DB
	root string
	log  hclog.Logger

	mu      sync.Mutex
	queue   []*logOp
	closed  bool
	failed  error           // sticky: the commit that failed
	inUse   map[uint64]bool // IDs of replicas open, or being created
	kick    chan struct{}
	done    chan struct{}
	commits atomic.Uint64
	writes  atomic.Uint64
}

// NodeLogConfig configures a NodeLog.
type NodeLogConfig struct {
	// Root is the directory under which every replica using the log keeps
	// its directory (the node's data dir); the database is Root/logs/raft-logs.db.
	Root string
	// NoSync skips fdatasync (RaftConfig.NoSync).
	NoSync bool
	Logger hclog.Logger
}

// Sentinel errors of the shared log.
var (
	// ErrLogClosed: the NodeLog was closed.
	ErrLogClosed = errors.New("shared log closed")
	// ErrLogFailed: a commit of the shared log failed, and the log takes no
	// more writes until the node restarts.
	ErrLogFailed = errors.New("shared log failed")
)

// logIDFile, in a replica's directory, holds the ID of its records in the
// node's shared log.
const logIDFile = "log-id"

// NodeLogFile is where, under its root, a NodeLog keeps its database.
const NodeLogFile = "logs/raft-logs.db"

var (
	bucketGroups = []byte("groups")
	bucketLogs   = []byte("logs")
	bucketStable = []byte("stable")
	keyDir       = []byte("dir")
	// errKeyNotFound is the error raft's stable store contract expects,
	// matched by its text ("not found"), as raft-boltdb's.
	errKeyNotFound = errors.New("not found")
	errSkipOp      = errors.New("operation failed")
)

// logOp is one queued write: fn runs inside the writer's transaction.
type logOp struct {
	fn   func(tx *bbolt.Tx) error
	done chan error
}

// OpenNodeLog opens (creating if missing) the shared log under cfg.Root,
// after checking its file (CheckBoltFile), and deletes the records of
// replicas whose directories are gone (Sweep). A file that fails the check
// is ErrCorruptReplica: the caller sets it aside and starts with an empty
// one, and every replica that had its log there finds it missing and is
// set aside in turn (OpenRaft).
func OpenNodeLog(cfg NodeLogConfig) (*NodeLog, error) {
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	path := filepath.Join(cfg.Root, NodeLogFile)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("shared log: %w", err)
	}
	if err := CheckBoltFile(path); err != nil {
		return nil, fmt.Errorf("shared log %s: %w", path, err)
	}
	var db *bbolt.DB
	err := Contain("shared log "+path, func() (err error) {
		db, err = bbolt.Open(path, 0o600, &bbolt.Options{
			Timeout:        2 * time.Second,
			NoSync:         cfg.NoSync,
			NoFreelistSync: true,
			FreelistType:   bbolt.FreelistMapType,
		})
		if err != nil {
			return err
		}
		return db.Update(func(tx *bbolt.Tx) error {
			_, err := tx.CreateBucketIfNotExists(bucketGroups)
			return err
		})
	})
	if err != nil {
		if db != nil {
			db.Close()
		}
		return nil, fmt.Errorf("opening shared log %s: %w", path, BoltOpenError(err))
	}
	l := &NodeLog{db: db, root: cfg.Root, log: cfg.Logger, inUse: map[uint64]bool{},
		kick: make(chan struct{}, 1), done: make(chan struct{})}
	go l.run()
	if _, err := l.Sweep(); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

// Path returns the database file's path.
func (l *NodeLog) Path() string { return l.db.Path() }

// Stats returns how many transactions the writer has committed and how
// many writes they carried.
func (l *NodeLog) Stats() (commits, writes uint64) { return l.commits.Load(), l.writes.Load() }

// Close stops the writer; queued writes fail with ErrLogClosed. The
// replicas using the log must be closed first.
func (l *NodeLog) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	l.mu.Unlock()
	l.signal()
	<-l.done
	return l.db.Close()
}

func (l *NodeLog) signal() {
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

// write queues fn for the writer's next transaction and waits until it is
// committed.
func (l *NodeLog) write(fn func(tx *bbolt.Tx) error) error {
	op := &logOp{fn: fn, done: make(chan error, 1)}
	l.mu.Lock()
	switch {
	case l.failed != nil:
		l.mu.Unlock()
		return fmt.Errorf("%w: %w", ErrLogFailed, l.failed)
	case l.closed:
		l.mu.Unlock()
		return ErrLogClosed
	}
	l.queue = append(l.queue, op)
	l.mu.Unlock()
	l.signal()
	return <-op.done
}

// run is the writer: it commits whatever is queued when it starts a
// transaction, until Close.
func (l *NodeLog) run() {
	defer close(l.done)
	for range l.kick {
		l.mu.Lock()
		batch, closed := l.queue, l.closed
		l.queue = nil
		l.mu.Unlock()
		if len(batch) > 0 {
			l.commit(batch)
		}
		if closed {
			l.mu.Lock()
			rest := l.queue
			l.queue = nil
			l.mu.Unlock()
			for _, op := range rest {
				op.done <- ErrLogClosed
			}
			return
		}
	}
}

// commit runs batch in one transaction. A write that fails on its own (its
// bucket deleted under it) is answered with its error and the transaction
// run again without it, so that one group's mistake never fails another's
// append.
func (l *NodeLog) commit(batch []*logOp) {
	for len(batch) > 0 {
		bad, badErr := -1, error(nil)
		err := l.db.Update(func(tx *bbolt.Tx) error {
			for i, op := range batch {
				if err := op.fn(tx); err != nil {
					bad, badErr = i, err
					return errSkipOp
				}
			}
			return nil
		})
		if bad >= 0 {
			batch[bad].done <- badErr
			batch = append(batch[:bad], batch[bad+1:]...)
			continue
		}
		if err != nil {
			err = fmt.Errorf("shared log commit: %w", err)
			if !IsNoSpace(err) {
				l.mu.Lock()
				l.failed = err
				l.mu.Unlock()
				l.log.Error("shared log commit failed; it takes no more writes until the node restarts", "error", err)
				err = fmt.Errorf("%w: %w", ErrLogFailed, err)
			}
		} else {
			l.commits.Add(1)
			l.writes.Add(uint64(len(batch)))
		}
		for _, op := range batch {
			op.done <- err
		}
		return
	}
}

func logIDKey(id uint64) []byte { return binary.BigEndian.AppendUint64(nil, id) }

// readLogID returns the log ID recorded in dir; false if none is.
func readLogID(dir string) (uint64, bool, error) {
	b, err := os.ReadFile(filepath.Join(dir, logIDFile))
	if errors.Is(err, os.ErrNotExist) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	id, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil || id == 0 {
		return 0, false, fmt.Errorf("%w: %s holds %q, not a log ID", ErrCorruptReplica, filepath.Join(dir, logIDFile), b)
	}
	return id, true, nil
}

// HasNodeLog reports whether the replica in dir keeps its log in a
// NodeLog (it has a log ID).
func HasNodeLog(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, logIDFile))
	return err == nil
}

// openGroup returns the log of the replica in dir: the records its log ID
// names, or, if dir has none, a new ID with an empty log. A dir whose ID
// names no records lost its log (the shared file was set aside, or the
// records swept): ErrCorruptReplica.
func (l *NodeLog) openGroup(dir string) (*groupLog, error) {
	rel, err := filepath.Rel(l.root, dir)
	if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return nil, fmt.Errorf("replica dir %s is not under the shared log's root %s", dir, l.root)
	}
	id, ok, err := readLogID(dir)
	if err != nil {
		return nil, err
	}
	if ok {
		l.mu.Lock()
		if l.inUse[id] {
			l.mu.Unlock()
			return nil, fmt.Errorf("the log of %s (ID %d) is open already", dir, id)
		}
		l.inUse[id] = true
		l.mu.Unlock()
		var have []byte
		err := l.db.View(func(tx *bbolt.Tx) error {
			if b := tx.Bucket(bucketGroups).Bucket(logIDKey(id)); b != nil {
				have = bytes.Clone(b.Get(keyDir))
			}
			return nil
		})
		if err == nil && string(have) != filepath.ToSlash(rel) {
			if have == nil {
				err = fmt.Errorf("%w: its log (ID %d) is not in the node's shared log %s", ErrCorruptReplica, id, l.Path())
			} else {
				err = fmt.Errorf("%w: its log ID %d belongs to %s in the shared log", ErrCorruptReplica, id, have)
			}
		}
		if err != nil {
			l.release(id)
			return nil, err
		}
		return &groupLog{l: l, id: id, key: logIDKey(id)}, nil
	}
	err = l.write(func(tx *bbolt.Tx) error {
		groups := tx.Bucket(bucketGroups)
		seq, err := groups.NextSequence()
		if err != nil {
			return err
		}
		b, err := groups.CreateBucket(logIDKey(seq))
		if err != nil {
			return err
		}
		if err := b.Put(keyDir, []byte(filepath.ToSlash(rel))); err != nil {
			return err
		}
		if _, err := b.CreateBucket(bucketLogs); err != nil {
			return err
		}
		if _, err := b.CreateBucket(bucketStable); err != nil {
			return err
		}
		// Registered before the commit, so that a Sweep queued behind
		// this write never takes the bucket for an orphan before dir
		// names it. (Undone below if the commit fails.)
		id = seq
		l.mu.Lock()
		l.inUse[id] = true
		l.mu.Unlock()
		return nil
	})
	if err != nil {
		if id != 0 {
			l.release(id)
		}
		return nil, fmt.Errorf("creating a log for %s in the shared log: %w", dir, err)
	}
	if err := WriteFileAtomic(dir, logIDFile, []byte(strconv.FormatUint(id, 10)+"\n")); err != nil {
		l.release(id)
		return nil, err
	}
	return &groupLog{l: l, id: id, key: logIDKey(id)}, nil
}

func (l *NodeLog) release(id uint64) {
	l.mu.Lock()
	delete(l.inUse, id)
	l.mu.Unlock()
}

// Sweep deletes the records of every replica that is not open and whose
// directory is gone or names another log ID (deleted, set aside, or
// replaced by a new incarnation), and returns how many it deleted. It
// costs a file read per such replica, nothing per open one.
func (l *NodeLog) Sweep() (int, error) {
	type cand struct {
		id  uint64
		dir string
	}
	var cands []cand
	l.mu.Lock()
	inUse := make(map[uint64]bool, len(l.inUse))
	for id := range l.inUse {
		inUse[id] = true
	}
	l.mu.Unlock()
	err := l.db.View(func(tx *bbolt.Tx) error {
		return tx.Bucket(bucketGroups).ForEach(func(k, v []byte) error {
			if v != nil || len(k) != 8 {
				return nil
			}
			id := binary.BigEndian.Uint64(k)
			if !inUse[id] {
				dir := tx.Bucket(bucketGroups).Bucket(k).Get(keyDir)
				cands = append(cands, cand{id: id, dir: string(dir)})
			}
			return nil
		})
	})
	if err != nil {
		return 0, fmt.Errorf("sweeping the shared log: %w", err)
	}
	var gone []uint64
	for _, c := range cands {
		id, ok, err := readLogID(filepath.Join(l.root, filepath.FromSlash(c.dir)))
		if c.dir != "" && err != nil && !errors.Is(err, ErrCorruptReplica) {
			continue // unreadable for now: keep
		}
		if !ok || id != c.id {
			gone = append(gone, c.id)
		}
	}
	if len(gone) == 0 {
		return 0, nil
	}
	deleted := 0
	err = l.write(func(tx *bbolt.Tx) error {
		deleted = 0
		l.mu.Lock()
		defer l.mu.Unlock()
		for _, id := range gone {
			if l.inUse[id] {
				continue
			}
			if err := tx.Bucket(bucketGroups).DeleteBucket(logIDKey(id)); err != nil && !errors.Is(err, bbolt.ErrBucketNotFound) {
				return err
			}
			deleted++
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("sweeping the shared log: %w", err)
	}
	if deleted > 0 {
		l.log.Info("shared log: deleted the records of replicas no longer on this node", "replicas", deleted)
	}
	return deleted, nil
}

// groupLog is one replica's part of a NodeLog: its raft.LogStore and
// raft.StableStore.
//
// Concurrency: raft calls it from several goroutines (appends from one,
// reads from replicators and the FSM's snapshotting); every method is safe
// for concurrent use.
type groupLog struct {
	l      *NodeLog
	id     uint64
	key    []byte
	closed atomic.Bool
}

var errGroupLogGone = errors.New("replica's records are gone from the shared log")

// bucket returns the replica's sub-bucket name of tx; nil if gone.
func (g *groupLog) bucket(tx *bbolt.Tx, name []byte) *bbolt.Bucket {
	b := tx.Bucket(bucketGroups).Bucket(g.key)
	if b == nil {
		return nil
	}
	return b.Bucket(name)
}

func (g *groupLog) view(name []byte, fn func(b *bbolt.Bucket) error) error {
	return g.l.db.View(func(tx *bbolt.Tx) error {
		b := g.bucket(tx, name)
		if b == nil {
			return errGroupLogGone
		}
		return fn(b)
	})
}

func (g *groupLog) update(name []byte, fn func(b *bbolt.Bucket) error) error {
	if g.closed.Load() {
		return ErrLogClosed
	}
	return g.l.write(func(tx *bbolt.Tx) error {
		b := g.bucket(tx, name)
		if b == nil {
			return errGroupLogGone
		}
		return fn(b)
	})
}

// Close releases the replica's log ID: its records stay until its
// directory goes (Sweep).
func (g *groupLog) Close() error {
	if !g.closed.Swap(true) {
		g.l.release(g.id)
	}
	return nil
}

func (g *groupLog) FirstIndex() (uint64, error) {
	var idx uint64
	err := g.view(bucketLogs, func(b *bbolt.Bucket) error {
		if k, _ := b.Cursor().First(); k != nil {
			idx = binary.BigEndian.Uint64(k)
		}
		return nil
	})
	return idx, err
}

func (g *groupLog) LastIndex() (uint64, error) {
	var idx uint64
	err := g.view(bucketLogs, func(b *bbolt.Bucket) error {
		if k, _ := b.Cursor().Last(); k != nil {
			idx = binary.BigEndian.Uint64(k)
		}
		return nil
	})
	return idx, err
}

func (g *groupLog) GetLog(index uint64, out *raft.Log) error {
	return g.view(bucketLogs, func(b *bbolt.Bucket) error {
		v := b.Get(binary.BigEndian.AppendUint64(nil, index))
		if v == nil {
			return raft.ErrLogNotFound
		}
		if err := decodeLogRecord(v, out); err != nil || out.Index != index {
			g.l.log.Error("shared log record does not decode; answering as if it were missing", "log_id", g.id, "index", index, "error", err, "error_kind", ErrCorruptReplica)
			return raft.ErrLogNotFound
		}
		return nil
	})
}

func (g *groupLog) StoreLog(l *raft.Log) error { return g.StoreLogs([]*raft.Log{l}) }

// StoreLogs encodes the records before queueing them, so that the writer's
// transaction, which every group waits on, only copies them in.
func (g *groupLog) StoreLogs(logs []*raft.Log) error {
	keys := make([][]byte, len(logs))
	vals := make([][]byte, len(logs))
	for i, l := range logs {
		keys[i] = binary.BigEndian.AppendUint64(nil, l.Index)
		vals[i] = encodeLogRecord(l)
	}
	return g.update(bucketLogs, func(b *bbolt.Bucket) error {
		// Appends come in index order: full pages, as a sequential
		// writer wants.
		b.FillPercent = 0.95
		for i := range keys {
			if err := b.Put(keys[i], vals[i]); err != nil {
				return err
			}
		}
		return nil
	})
}

func (g *groupLog) DeleteRange(min, max uint64) error {
	return g.update(bucketLogs, func(b *bbolt.Bucket) error {
		c := b.Cursor()
		for k, _ := c.Seek(binary.BigEndian.AppendUint64(nil, min)); k != nil && binary.BigEndian.Uint64(k) <= max; k, _ = c.Next() {
			if err := c.Delete(); err != nil {
				return err
			}
		}
		return nil
	})
}

func (g *groupLog) Set(k, v []byte) error {
	k, v = bytes.Clone(k), bytes.Clone(v)
	return g.update(bucketStable, func(b *bbolt.Bucket) error { return b.Put(k, v) })
}

func (g *groupLog) Get(k []byte) ([]byte, error) {
	var v []byte
	err := g.view(bucketStable, func(b *bbolt.Bucket) error {
		if x := b.Get(k); x != nil {
			v = bytes.Clone(x)
		}
		return nil
	})
	if err == nil && v == nil {
		err = errKeyNotFound
	}
	return v, err
}

func (g *groupLog) SetUint64(k []byte, v uint64) error {
	return g.Set(k, binary.BigEndian.AppendUint64(nil, v))
}

func (g *groupLog) GetUint64(k []byte) (uint64, error) { return getUint64(g.Get, k) }

// getUint64 reads a stable key SetUint64 wrote: 8 bytes, big-endian, as
// raft-boltdb stores them.
func getUint64(get func([]byte) ([]byte, error), k []byte) (uint64, error) {
	v, err := get(k)
	if err != nil {
		return 0, err
	}
	if len(v) != 8 {
		return 0, fmt.Errorf("%w: stable key %q holds %d bytes, not a uint64", ErrCorruptReplica, k, len(v))
	}
	return binary.BigEndian.Uint64(v), nil
}

// logRecordHeader is the fixed part of an encoded record.
const logRecordHeader = 8 + 8 + 1 + 8 + 4

func encodeLogRecord(l *raft.Log) []byte {
	b := make([]byte, logRecordHeader, logRecordHeader+len(l.Extensions)+len(l.Data))
	le := binary.LittleEndian
	le.PutUint64(b[0:], l.Index)
	le.PutUint64(b[8:], l.Term)
	b[16] = byte(l.Type)
	var at int64
	if !l.AppendedAt.IsZero() {
		at = l.AppendedAt.UnixNano()
	}
	le.PutUint64(b[17:], uint64(at))
	le.PutUint32(b[25:], uint32(len(l.Extensions)))
	b = append(b, l.Extensions...)
	return append(b, l.Data...)
}

// decodeLogRecord decodes v into out, copying: v lives in bolt's mapping
// only as long as its transaction.
func decodeLogRecord(v []byte, out *raft.Log) error {
	if len(v) < logRecordHeader {
		return fmt.Errorf("record of %d bytes is shorter than its header", len(v))
	}
	le := binary.LittleEndian
	ext := uint64(le.Uint32(v[25:]))
	if ext > uint64(len(v)-logRecordHeader) {
		return fmt.Errorf("record of %d bytes claims %d bytes of extensions", len(v), ext)
	}
	out.Index = le.Uint64(v[0:])
	out.Term = le.Uint64(v[8:])
	out.Type = raft.LogType(v[16])
	out.AppendedAt = time.Time{}
	if at := int64(le.Uint64(v[17:])); at != 0 {
		out.AppendedAt = time.Unix(0, at)
	}
	rest := bytes.Clone(v[logRecordHeader:])
	out.Extensions, out.Data = nil, nil
	if ext > 0 {
		out.Extensions = rest[:ext:ext]
	}
	if len(rest) > int(ext) {
		out.Data = rest[ext:]
	}
	return nil
}

// WriteFileAtomic replaces dir/name with b: a temporary file, fsynced, then
// renamed over it, and the directory fsynced so the rename is durable.
func WriteFileAtomic(dir, name string, b []byte) error {
	wrap := func(err error) error { return fmt.Errorf("writing %s: %w", filepath.Join(dir, name), err) }
	tmp, err := os.CreateTemp(dir, "."+name+".tmp*")
	if err != nil {
		return wrap(err)
	}
	defer os.Remove(tmp.Name()) // after a successful rename, a no-op
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return wrap(err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return wrap(err)
	}
	if err := tmp.Close(); err != nil {
		return wrap(err)
	}
	if err := os.Rename(tmp.Name(), filepath.Join(dir, name)); err != nil {
		return wrap(err)
	}
	d, err := os.Open(dir)
	if err != nil {
		return wrap(err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return wrap(err)
	}
	return nil
}
