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

	"github.com/hashicorp/raft"
	"github.com/raftps/raftps/store"
)

// fsm is the raft.FSM of one shard replica: a store.Table plus the dedupe
// record of applied (client, seq) pairs.
//
// Concurrency, following raft's contract: ApplyBatch, Apply, Snapshot and
// Restore are called from raft's FSM goroutine one at a time, and only they
// touch dd and reader. FSMSnapshot.Persist runs on another goroutine
// concurrently with later applies; the store's copy-on-write snapshot makes
// that safe. Readers (Lookup, waitApplied) run on any goroutine: they reach the
// table through an atomic pointer, swapped by Restore.
type fsm struct {
	group string
	cfg   store.TableConfig
	table atomic.Pointer[store.Table]

	dd        *dedupe
	reader    pushBatchReader
	sinceGC   int
	lastTime  int64 // leader time of the last push batch applied
	appliedIx atomic.Uint64
	notify    atomic.Pointer[chan struct{}] // closed after each apply, then replaced
}

// pushOutcome is the FSM's answer for one push of a batch.
type pushOutcome struct {
	err       error // nil: applied now or before
	duplicate bool  // it had been applied before
}

// batchResult is what ApplyBatch returns for a push batch log entry.
type batchResult struct {
	outcomes []pushOutcome
	err      error // the entry itself could not be decoded
}

func newFSM(group string, cfg store.TableConfig, dedupeTTL time.Duration) (*fsm, error) {
	t, err := store.NewTable(cfg)
	if err != nil {
		return nil, err
	}
	f := &fsm{group: group, cfg: cfg, dd: newDedupe(dedupeTTL)}
	f.table.Store(t)
	ch := make(chan struct{})
	f.notify.Store(&ch)
	return f, nil
}

func (f *fsm) Apply(l *raft.Log) any { return f.ApplyBatch([]*raft.Log{l})[0] }

func (f *fsm) ApplyBatch(logs []*raft.Log) []any {
	out := make([]any, len(logs))
	for i, l := range logs {
		if l.Type == raft.LogCommand {
			out[i] = f.applyCommand(l.Data)
		}
	}
	if len(logs) > 0 {
		f.setApplied(logs[len(logs)-1].Index)
	}
	return out
}

func (f *fsm) applyCommand(cmd []byte) *batchResult {
	if len(cmd) == 1 && cmd[0] == cmdNoop {
		return &batchResult{}
	}
	if len(cmd) == 0 || cmd[0] != cmdPush {
		return &batchResult{err: fmt.Errorf("group %s: unknown command type", f.group)}
	}
	r := &f.reader
	if err := r.reset(cmd, f.cfg.Dim); err != nil {
		return &batchResult{err: fmt.Errorf("group %s: %w", f.group, err)}
	}
	now := r.leaderTime
	f.lastTime = max(f.lastTime, now)
	t := f.table.Load()
	res := &batchResult{outcomes: make([]pushOutcome, 0, r.left)}
	for {
		p, err := r.next()
		if err != nil {
			// Outcomes so far stand: those pushes were applied on every
			// replica, which all decode the same bytes the same way.
			res.err = fmt.Errorf("group %s: %w", f.group, err)
			return res
		}
		if p == nil {
			break
		}
		var o pushOutcome
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
	return res
}

func (f *fsm) setApplied(ix uint64) {
	f.appliedIx.Store(ix)
	ch := make(chan struct{})
	old := f.notify.Swap(&ch)
	close(*old)
}

// waitApplied returns once the FSM has applied index ix.
func (f *fsm) waitApplied(ctx context.Context, ix uint64) error {
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

type fsmSnapshot struct {
	head []byte
	snap *store.Snapshot
}

func (f *fsm) Snapshot() (raft.FSMSnapshot, error) {
	head := append([]byte(fsmMagic), make([]byte, 12)...)
	binary.LittleEndian.PutUint64(head[8:], f.appliedIx.Load())
	dd := f.dd.appendTo(nil)
	binary.LittleEndian.PutUint32(head[16:], uint32(len(dd)))
	head = append(head, dd...)
	head = binary.LittleEndian.AppendUint32(head, crc32.Checksum(head, castagnoli))
	return &fsmSnapshot{head: head, snap: f.table.Load().Snapshot()}, nil
}

func (s *fsmSnapshot) Persist(sink raft.SnapshotSink) error {
	w := bufio.NewWriterSize(sink, 1<<20)
	_, err := w.Write(s.head)
	if err == nil {
		_, err = s.snap.WriteTo(w)
	}
	if err == nil {
		err = w.Flush()
	}
	if err != nil {
		_ = sink.Cancel()
		return fmt.Errorf("persisting snapshot: %w", err)
	}
	return sink.Close()
}

func (s *fsmSnapshot) Release() { s.snap.Release() }

func (f *fsm) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	br := bufio.NewReaderSize(rc, 1<<20)
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
	f.setApplied(ix)
	return nil
}
