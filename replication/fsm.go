package replication

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	"github.com/raftps/raftps/store"
)

// FSM is the replicated state of one shard replica: a store.Table plus the
// dedupe record of applied (client, seq) pairs, and the index of the last
// log entry applied. Raft groups and chain replicas share it: a Group hands
// it to raft (through raftFSM, which makes it a raft.BatchingFSM); a chain
// replica calls ApplyCommand itself, in its log's order.
//
// Concurrency: ApplyCommand, SetApplied, Snapshot and Restore change or
// capture the replicated state and must be called one at a time, never
// concurrently with each other (raft calls them from its FSM goroutine; a
// chain replica under its own lock); only they touch dd and reader.
// Snapshot.WriteTo runs on any goroutine concurrently with later applies:
// the store's copy-on-write snapshot makes that safe. Table, AppliedIndex
// and waitApplied run on any goroutine: they reach the table through an
// atomic pointer, swapped by Restore.
type FSM struct {
	group string
	cfg   store.TableConfig
	table atomic.Pointer[store.Table]

	dd        *dedupe
	reader    pushBatchReader
	sinceGC   int
	lastTime  int64 // leader time of the last push batch applied
	appliedIx atomic.Uint64
	notify    atomic.Pointer[chan struct{}] // closed after each apply, then replaced
	metrics   *GroupMetrics
}

// pushOutcome is the FSM's answer for one push of a batch.
type pushOutcome struct {
	err       error // nil: applied now or before
	duplicate bool  // it had been applied before
}

// ApplyResult is what applying one command did: each push's outcome, in the
// command's order, for Batch.Answer.
type ApplyResult struct {
	outcomes []pushOutcome
	err      error // the entry itself could not be decoded
}

// Err reports that the command was refused whole (ErrBadEntry): it does not
// decode (truncated, a count larger than its bytes hold, trailing bytes) or
// is of no known type. Such an entry changes nothing, on every replica
// alike, since all decode the same bytes the same way: it is a bad entry,
// not a divergence, and every push in it is answered with the error.
func (r *ApplyResult) Err() error { return r.err }

// NewFSM returns the empty state of a replica of a shard of the table cfg;
// group names it in errors. Dedupe windows idle for longer than dedupeTTL
// (in leader time) expire.
func NewFSM(group string, cfg store.TableConfig, dedupeTTL time.Duration) (*FSM, error) {
	t, err := store.NewTable(cfg)
	if err != nil {
		return nil, err
	}
	f := &FSM{group: group, cfg: cfg, dd: newDedupe(dedupeTTL)}
	f.table.Store(t)
	ch := make(chan struct{})
	f.notify.Store(&ch)
	return f, nil
}

// Table returns the table the replica serves (Restore replaces it).
func (f *FSM) Table() *store.Table { return f.table.Load() }

// AppliedIndex returns the index last given to SetApplied (or restored).
func (f *FSM) AppliedIndex() uint64 { return f.appliedIx.Load() }

// ApplyCommand applies one command (a log entry's payload: see command.go):
// each push of a push batch through store, skipping any (client, seq) the
// dedupe record holds, in order. Its result is the same on every replica
// that applies the same commands in the same order. It does not advance
// the applied index: SetApplied does, once the entry (or a run of them) is
// applied.
func (f *FSM) ApplyCommand(cmd []byte) *ApplyResult {
	if len(cmd) == 1 && cmd[0] == cmdNoop {
		return &ApplyResult{}
	}
	if len(cmd) == 0 || cmd[0] != cmdPush {
		typ := -1
		if len(cmd) > 0 {
			typ = int(cmd[0])
		}
		return &ApplyResult{err: fmt.Errorf("group %s: %w: unknown command type %d (%d bytes)", f.group, ErrBadEntry, typ, len(cmd))}
	}
	// Wall-clock time only feeds the metrics, never the state.
	start := time.Now()
	rows := 0
	r := &f.reader
	err := r.reset(cmd, f.cfg.Dim)
	if err == nil {
		// The whole entry is checked before any of it is applied, so a bad
		// one leaves the state as it was, not half-applied.
		err = r.validate()
	}
	if err != nil {
		return &ApplyResult{err: fmt.Errorf("group %s: %w: %w", f.group, ErrBadEntry, err)}
	}
	now := r.leaderTime
	f.lastTime = max(f.lastTime, now)
	t := f.table.Load()
	res := &ApplyResult{outcomes: make([]pushOutcome, 0, r.left)}
	for {
		p, err := r.next()
		if err != nil {
			// validate passed, so this is a bug in the reader, not a bad
			// entry; still no panic, and every replica fails alike.
			res.err = fmt.Errorf("group %s: %w: %w", f.group, ErrBadEntry, err)
			return res
		}
		if p == nil {
			break
		}
		var o pushOutcome
		rows += len(p.Keys)
		switch err := f.dd.check(p.Client, p.Seq, now); {
		case errors.Is(err, errDuplicate):
			o.duplicate = true
		case err != nil:
			o.err = err
		default:
			if o.err = t.Apply(p.Keys, p.Grads); o.err == nil {
				f.dd.record(p.Client, p.Seq, now)
			}
		}
		res.outcomes = append(res.outcomes, o)
	}
	if f.sinceGC++; f.sinceGC >= 1024 {
		f.sinceGC = 0
		f.dd.expire(now)
	}
	f.metrics.applied(start, len(res.outcomes), rows)
	return res
}

// SetMetrics makes the FSM record its applies and installed snapshots in m
// (nil: none). Call it before the FSM is used.
func (f *FSM) SetMetrics(m *GroupMetrics) { f.metrics = m }

// Metrics returns what SetMetrics set.
func (f *FSM) Metrics() *GroupMetrics { return f.metrics }

// SetApplied records that every entry up to ix is applied, and wakes
// waitApplied.
func (f *FSM) SetApplied(ix uint64) {
	f.appliedIx.Store(ix)
	ch := make(chan struct{})
	old := f.notify.Swap(&ch)
	close(*old)
}

// waitApplied returns once the FSM has applied index ix.
func (f *FSM) waitApplied(ctx context.Context, ix uint64) error {
	for {
		ch := *f.notify.Load()
		if f.appliedIx.Load() >= ix {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("group %s: waiting for index %d (applied %d): %w", f.group, ix, f.appliedIx.Load(), ctx.Err())
		}
	}
}

// FSM snapshot stream:
//
//	"RPSFSM01" | applied index u64 | dedupe length u32 | dedupe state | crc32c of all before | store snapshot
const fsmMagic = "RPSFSM01"

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Snapshot is a point-in-time copy of an FSM's state; Release it when done.
type Snapshot struct {
	head []byte
	snap *store.Snapshot
}

// Snapshot captures the state: O(1) for the table (copy-on-write) plus a
// copy of the dedupe record.
func (f *FSM) Snapshot() *Snapshot {
	head := append([]byte(fsmMagic), make([]byte, 12)...)
	binary.LittleEndian.PutUint64(head[8:], f.appliedIx.Load())
	dd := f.dd.appendTo(nil)
	binary.LittleEndian.PutUint32(head[16:], uint32(len(dd)))
	head = append(head, dd...)
	head = binary.LittleEndian.AppendUint32(head, crc32.Checksum(head, castagnoli))
	return &Snapshot{head: head, snap: f.table.Load().Snapshot()}
}

// WriteTo writes the snapshot stream, which Restore reads, to w in writes of
// up to 1 MiB.
func (s *Snapshot) WriteTo(w io.Writer) (int64, error) {
	bw := bufio.NewWriterSize(w, 1<<20)
	k, err := bw.Write(s.head)
	n := int64(k)
	if err == nil {
		var m int64
		m, err = s.snap.WriteTo(bw)
		n += m
	}
	if err == nil {
		err = bw.Flush()
	}
	return n, err
}

// Release frees the table's snapshot.
func (s *Snapshot) Release() { s.snap.Release() }

// Restore replaces the state with the snapshot stream rc holds (which it
// closes). A corrupt snapshot, or one of another table, is refused and
// changes nothing.
func (f *FSM) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	start, counted := time.Now(), &countingReader{ReadCloser: rc}
	br := bufio.NewReaderSize(counted, 1<<20)
	head := make([]byte, 20)
	if _, err := io.ReadFull(br, head); err != nil {
		return fmt.Errorf("group %s: restore: reading header: %w", f.group, err)
	}
	if string(head[:8]) != fsmMagic {
		return fmt.Errorf("group %s: restore: %w: not an FSM snapshot", f.group, store.ErrCorruptSnapshot)
	}
	ix := binary.LittleEndian.Uint64(head[8:])
	n := binary.LittleEndian.Uint32(head[16:])
	if n > 1<<30 {
		return fmt.Errorf("group %s: restore: %w: dedupe state of %d bytes", f.group, store.ErrCorruptSnapshot, n)
	}
	head = append(head, make([]byte, n+4)...)
	if _, err := io.ReadFull(br, head[20:]); err != nil {
		return fmt.Errorf("group %s: restore: reading dedupe state: %w", f.group, err)
	}
	if crc32.Checksum(head[:20+n], castagnoli) != binary.LittleEndian.Uint32(head[20+n:]) {
		return fmt.Errorf("group %s: restore: %w: header checksum", f.group, store.ErrCorruptSnapshot)
	}
	dd := newDedupe(time.Duration(f.dd.ttl))
	if _, err := dd.decode(head[20 : 20+n]); err != nil {
		return fmt.Errorf("group %s: restore: %w: %v", f.group, store.ErrCorruptSnapshot, err)
	}
	t, err := store.Load(br)
	if err != nil {
		return fmt.Errorf("group %s: restore: %w", f.group, err)
	}
	if t.Config() != f.cfg {
		return fmt.Errorf("group %s: restore: %w: snapshot is of %s, group serves %s", f.group, store.ErrConfigMismatch, t.Config(), f.cfg)
	}
	f.table.Store(t)
	f.dd = dd
	f.SetApplied(ix)
	f.metrics.Snapshot(true, counted.n, time.Since(start))
	return nil
}

// raftFSM is an FSM as raft.FSM: a Raft group's log entries are commands.
// A bad entry is refused (ApplyResult.Err) and logged on each replica.
type raftFSM struct {
	*FSM
	log hclog.Logger
}

var _ raft.BatchingFSM = raftFSM{}

func (f raftFSM) Apply(l *raft.Log) any { return f.ApplyBatch([]*raft.Log{l})[0] }

func (f raftFSM) ApplyBatch(logs []*raft.Log) []any {
	out := make([]any, len(logs))
	for i, l := range logs {
		if l.Type == raft.LogCommand {
			res := f.ApplyCommand(l.Data)
			if res.err != nil && f.log != nil {
				f.log.Warn("bad log entry refused", "group", f.group, "index", l.Index, "term", l.Term, "error", res.err)
			}
			out[i] = res
		}
	}
	if len(logs) > 0 {
		f.SetApplied(logs[len(logs)-1].Index)
	}
	return out
}

func (f raftFSM) Snapshot() (raft.FSMSnapshot, error) {
	return raftSnapshot{f.FSM.Snapshot(), f.metrics}, nil
}

// raftSnapshot is a Snapshot as raft.FSMSnapshot.
type raftSnapshot struct {
	*Snapshot
	metrics *GroupMetrics
}

func (s raftSnapshot) Persist(sink raft.SnapshotSink) error {
	start := time.Now()
	n, err := s.WriteTo(sink)
	if err != nil {
		_ = sink.Cancel()
		return fmt.Errorf("persisting snapshot: %w", err)
	}
	if err := sink.Close(); err != nil {
		return err
	}
	s.metrics.Snapshot(false, n, time.Since(start))
	return nil
}
