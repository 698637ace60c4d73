package chain

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/raftps/raftps/replication"
	"github.com/raftps/raftps/store"
)

// Role is a replica's place in its chain.
type Role uint8

const (
	RoleNone   Role = iota // not in the chain's order
	RoleHead               // takes pushes (and is also the tail in a chain of one)
	RoleMiddle             // forwards entries and acks
	RoleTail               // commits what it applies; serves linearizable reads
)

func (r Role) String() string {
	switch r {
	case RoleHead:
		return "head"
	case RoleMiddle:
		return "middle"
	case RoleTail:
		return "tail"
	}
	return "none"
}

// Chain is one replica of one chain-replicated shard on one node. See the
// package documentation for the protocol and the goroutines.
//
// Concurrency: every method is safe for concurrent use. Locks, always taken
// in this order (a goroutine holding one may take those after it):
//
//	snapMu   serialises writing snapshots to Dir and installing them
//	applyMu  serialises changes to the replicated state and the log: appends
//	         (head batches and forwarded entries), fsm applies, taking a
//	         snapshot, installing one, and configuration changes. The FSM's
//	         one-at-a-time contract holds because of it.
//	mu       configuration (written under applyMu too, so either lock reads
//	         it), commit state, the in-memory entry cache, waiting pushes,
//	         the sender and inbound streams. Never held across I/O.
//	dirtyMu  CRAQ's per-key in-flight counts.
type Chain struct {
	cfg Config
	who string // "chain ID", for errors
	log hclog.Logger
	st  *storage
	fsm *replication.FSM
	mux *Mux

	batcher *replication.Batcher // head: a batch per logged, uncommitted entry
	snapCh  chan snapJob

	snapMu sync.Mutex

	applyMu   sync.Mutex
	last      uint64 // index of the last entry persisted and applied (== fsm.AppliedIndex())
	lastEpoch uint64 // creation epoch of entry last
	snapIndex uint64 // the snapshot chain.db records
	snapEpoch uint64
	sinceSnap uint64
	installs  uint64 // snapshots installed from the predecessor; a periodic snapshot taken before one is void

	mu          sync.Mutex
	epoch       uint64
	order       []string
	role        Role
	pred, succ  string
	committed   uint64
	commitFloor uint64 // lower bound on the chain's commit index; may exceed last
	// syncedEpoch is the epoch in which the current predecessor's stream
	// settled this replica's log: after its hello, the predecessor either
	// confirmed the log matches its own (and resumed after its last entry)
	// or replaced it with a snapshot. Until then (a new epoch, a restart)
	// the log may hold entries the chain never committed (a removed head's
	// leftovers), so a non-head counts nothing more as committed, serves no
	// linearizable or CRAQ read and forwards nothing. Written under applyMu
	// and mu. See syncedLocked.
	syncedEpoch uint64
	syncCh      chan struct{} // closed once syncedLocked holds in this epoch
	sendGen     uint64        // counts senders started; acks of an older one are void
	broken      error
	waiting     []*headEntry // head: logged entries not yet committed, by index
	mem         [][]byte     // entries memFirst.. last, for the sender
	memFirst    uint64
	appendCh    chan struct{} // closed and replaced after each append
	commitCh    chan struct{} // closed and replaced when committed grows
	senderStop  func()        // cancels the current sender, if any
	inbound     map[*inboundStream]struct{}

	dirtyMu    sync.RWMutex
	dirty      map[uint64]int32 // key -> applied-but-uncommitted entries touching it
	dirtyLog   []dirtyEntry     // those entries' keys, by index
	dirtyUntil uint64           // every key is dirty until committed reaches it (after a snapshot install)

	committedIx atomic.Uint64 // mirror of committed for lock-free readers
	epochIx     atomic.Uint64 // mirror of epoch

	closeOnce sync.Once
	closed    chan struct{}
	wg        sync.WaitGroup

	// Test hooks: pauseForward stops the sender from sending entries.
	pauseForward atomic.Bool
}

// headEntry is a logged head entry whose pushes wait for its commit.
type headEntry struct {
	index uint64
	batch *replication.Batch
	res   *replication.ApplyResult
}

type dirtyEntry struct {
	index uint64
	keys  []uint64
}

type snapJob struct {
	index, epoch uint64
	installs     uint64 // Chain.installs when it was taken
	snap         *replication.Snapshot
}

// Open opens the replica in cfg.Dir, recovering its last snapshot and
// log, and registers it with cfg.Mux. A replica without a configuration
// (a new one) serves nothing until SetConfig.
func Open(cfg Config) (*Chain, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	f, err := replication.NewFSM(cfg.ID, cfg.Table, cfg.DedupeTTL)
	if err != nil {
		return nil, fmt.Errorf("chain %s: %w", cfg.ID, err)
	}
	f.SetMetrics(cfg.Metrics)
	st, meta, err := openStorage(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("chain %s: %w", cfg.ID, err)
	}
	c := &Chain{
		cfg: cfg, who: "chain " + cfg.ID, log: cfg.Logger.With("chain", cfg.ID, "node", cfg.NodeAddr), st: st, fsm: f, mux: cfg.Mux,
		snapCh:   make(chan snapJob, 1),
		appendCh: make(chan struct{}),
		commitCh: make(chan struct{}),
		inbound:  map[*inboundStream]struct{}{},
		dirty:    map[uint64]int32{},
		closed:   make(chan struct{}),
	}
	c.batcher = replication.NewBatcher(replication.BatcherConfig{
		Who: c.who, MaxEntryBytes: cfg.MaxEntryBytes, EntryPrefix: entryHeader, MaxInflight: cfg.MaxInflight, Closed: c.closed,
	})
	// Recovery only reads (the snapshot, the log): a failure or a panic
	// there is a corrupt replica, unless the disk is full.
	if err := replication.Contain("chain "+cfg.ID, func() error { return c.recover(meta) }); err != nil {
		st.close()
		if !errors.Is(err, replication.ErrCorruptReplica) && !replication.IsNoSpace(err) {
			err = fmt.Errorf("%w: %w", replication.ErrCorruptReplica, err)
		}
		return nil, fmt.Errorf("chain %s: recovering from %s: %w", cfg.ID, cfg.Dir, err)
	}
	if err := c.mux.add(c); err != nil {
		st.close()
		return nil, err
	}
	c.wg.Add(2)
	go c.batchLoop()
	go c.snapshotLoop()
	c.mu.Lock()
	c.startSenderLocked()
	c.mu.Unlock()
	return c, nil
}

// recover loads the snapshot and replays the log after it.
func (c *Chain) recover(m storedMeta) error {
	if m.snapIndex > 0 {
		f, err := c.st.openSnapshot(m.snapIndex)
		if err != nil {
			return err
		}
		if err := c.fsm.Restore(f); err != nil { // closes f
			return err
		}
		if got := c.fsm.AppliedIndex(); got != m.snapIndex {
			return fmt.Errorf("snapshot file of index %d holds index %d", m.snapIndex, got)
		}
	}
	c.snapIndex, c.snapEpoch = m.snapIndex, m.snapEpoch
	c.last, c.lastEpoch = m.snapIndex, m.snapEpoch
	c.epoch, c.order = m.epoch, m.order
	c.epochIx.Store(m.epoch)
	c.setRoleLocked()
	c.resetSyncLocked()
	var replayed [][]byte
	err := c.st.replay(m.snapIndex, func(ix uint64, e []byte) error {
		if len(e) < entryHeader {
			return fmt.Errorf("entry %d is %d bytes", ix, len(e))
		}
		c.markDirtyLocked(ix, e) // dropped below if committed
		if res := c.fsm.ApplyCommand(e[entryHeader:]); res.Err() != nil {
			c.log.Warn("bad log entry refused", "index", ix, "error", res.Err())
		}
		c.last, c.lastEpoch = ix, entryEpoch(e)
		replayed = append(replayed, e)
		return nil
	})
	if err != nil {
		return err
	}
	c.fsm.SetApplied(c.last)
	c.sinceSnap = c.last - c.snapIndex
	c.mem, c.memFirst = replayed, m.snapIndex+1
	c.committed = min(m.committed, c.last)
	// Only a chain of one commits its whole log at once: its log is the
	// chain's. A recovered tail does not: its log may end in entries it had
	// not been synced with (it may have been a removed head appended again
	// and stopped before its predecessor's handshake), and the committed
	// index recorded with its appends is a true one. It commits the rest
	// once its predecessor's stream settles its log (markSyncedLocked).
	if c.pred == "" && c.succ == "" && c.role == RoleHead {
		c.committed = c.last
	}
	c.commitFloor = c.committed
	c.committedIx.Store(c.committed)
	c.releaseDirty(c.committed)
	c.trimMemLocked()
	return nil
}

// ID returns the group's ID.
func (c *Chain) ID() string { return c.cfg.ID }

// Table returns the table the replica currently serves (it changes when a
// snapshot is installed).
func (c *Chain) Table() *store.Table { return c.fsm.Table() }

// Checksum returns the digest of the replica's rows (store.Table.Checksum).
func (c *Chain) Checksum() uint64 { return c.Table().Checksum() }

// AppliedIndex returns the index of the last entry applied (and persisted).
func (c *Chain) AppliedIndex() uint64 { return c.fsm.AppliedIndex() }

// CommittedIndex returns the highest index this replica knows the tail has
// applied. It only counts entries its predecessor's stream has confirmed (a
// replica's leftover log counts only once the handshake has settled it).
func (c *Chain) CommittedIndex() uint64 { return c.committedIx.Load() }

// Epoch returns the epoch of the replica's configuration.
func (c *Chain) Epoch() uint64 { return c.epochIx.Load() }

// Order returns the chain's members, head first, as of Epoch.
func (c *Chain) Order() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.order)
}

// Role returns the replica's place in the chain.
func (c *Chain) Role() Role {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.role
}

// Err returns the storage error that stopped the replica, if any.
func (c *Chain) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.broken
}

// Close stops the replica's goroutines, unregisters it from its Mux and
// closes its log. Pushes waiting for a commit fail with
// replication.ErrUnknownOutcome; pushes not yet logged with
// replication.ErrGroupClosed.
func (c *Chain) Close() error {
	var err error
	c.closeOnce.Do(func() {
		c.mux.remove(c)
		c.applyMu.Lock()
		c.mu.Lock()
		close(c.closed)
		c.stopStreamsLocked()
		c.failWaitingLocked(fmt.Errorf("chain %s: %w: %w", c.cfg.ID, replication.ErrUnknownOutcome, replication.ErrGroupClosed))
		c.mu.Unlock()
		c.applyMu.Unlock()
		c.wg.Wait()
		c.batcher.Drain()
		select {
		case job := <-c.snapCh:
			job.snap.Release()
		default:
		}
		// Under applyMu, as every other use of the store: a SetConfig
		// racing Close finds it closed (checked under applyMu) or finishes
		// first.
		c.applyMu.Lock()
		err = c.st.close()
		c.applyMu.Unlock()
	})
	return err
}

func (c *Chain) closedErr() error {
	return fmt.Errorf("chain %s: %w", c.cfg.ID, replication.ErrGroupClosed)
}

func (c *Chain) isClosed() bool {
	select {
	case <-c.closed:
		return true
	default:
		return false
	}
}

// SetConfig installs the chain's configuration of epoch: its members, head
// first, as the meta group decided. Epochs only grow: an older epoch, or the
// current one with a different order, is refused with ErrStaleEpoch; the
// current one with the same order is a no-op. The configuration is persisted
// before it takes effect.
//
// The meta group must keep the members that stay in the order they had and
// add new members only at the tail: then every member's log is a prefix of
// its predecessor's, which is what lets a predecessor resend only what its
// successor lacks. (A successor whose log does not match gets a snapshot,
// which replaces whatever it applied.)
//
// Effects: a node not in order stops serving and fails its waiting pushes
// with replication.ErrUnknownOutcome (as does a head that is no longer
// head); a chain of one commits everything it has applied; any other member
// is unsynced until its predecessor's stream of the new epoch settles its log
// (then a tail commits everything it has applied); every member with a successor opens a
// new stream to it, in the new epoch, once it is synced itself, and resends
// what it lacks.
func (c *Chain) SetConfig(epoch uint64, order []string) error {
	if len(order) == 0 {
		return fmt.Errorf("chain %s: %w: empty order", c.cfg.ID, replication.ErrBadRequest)
	}
	for i, m := range order {
		if m == "" || slices.Contains(order[:i], m) {
			return fmt.Errorf("chain %s: %w: order %q has an empty or repeated member", c.cfg.ID, replication.ErrBadRequest, order)
		}
	}
	c.applyMu.Lock()
	defer c.applyMu.Unlock()
	if c.isClosed() {
		return c.closedErr()
	}
	c.mu.Lock()
	cur, curOrder, broken := c.epoch, c.order, c.broken
	c.mu.Unlock()
	switch {
	case broken != nil:
		return broken
	case epoch < cur:
		return fmt.Errorf("chain %s: %w: epoch %d is older than %d", c.cfg.ID, ErrStaleEpoch, epoch, cur)
	case epoch == cur && slices.Equal(order, curOrder):
		return nil
	case epoch == cur:
		return fmt.Errorf("chain %s: %w: epoch %d already has order %q, not %q", c.cfg.ID, ErrStaleEpoch, epoch, curOrder, order)
	}
	order = slices.Clone(order)
	if err := c.st.saveConfig(epoch, order); err != nil {
		return c.failStorage(fmt.Errorf("saving configuration of epoch %d: %w", epoch, err))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	wasHead := c.role == RoleHead
	c.epoch, c.order = epoch, order
	c.epochIx.Store(epoch)
	c.setRoleLocked()
	c.resetSyncLocked()
	c.log.Info("chain configuration", "epoch", epoch, "order", order, "role", c.role)
	c.stopStreamsLocked()
	if wasHead && c.role != RoleHead {
		c.failWaitingLocked(fmt.Errorf("chain %s: %w: head replaced in epoch %d", c.cfg.ID, replication.ErrUnknownOutcome, epoch))
	}
	if c.role == RoleNone {
		return nil
	}
	if c.pred == "" && c.succ == "" { // a chain of one: its log is the chain's
		c.commitLocked(c.last)
	}
	// Any other tail commits what it has applied only once its predecessor's
	// stream has settled its log in this epoch (markSyncedLocked): before,
	// its log may end in a removed head's entries that the chain replaced.
	c.startSenderLocked()
	return nil
}

// syncedLocked reports whether this replica's log is known to be a prefix of
// its predecessor's in the current epoch: always for the head (its log is
// the chain's), otherwise once the predecessor's stream of this epoch has
// settled it (syncedEpoch). Caller holds applyMu or mu.
func (c *Chain) syncedLocked() bool {
	return c.pred == "" || c.syncedEpoch == c.epoch
}

// resetSyncLocked starts the sync state of a new configuration. Caller
// holds applyMu and mu (or owns the Chain, in recover).
func (c *Chain) resetSyncLocked() {
	c.syncCh = make(chan struct{})
	if c.syncedLocked() {
		close(c.syncCh)
	}
}

// markSyncedLocked records that the predecessor's stream of this epoch
// settled the log: it matched the predecessor's (the stream resumes right
// after its last entry) or was replaced by the predecessor's snapshot. The
// log is then a prefix of the predecessor's, so a tail commits all of it,
// and the sender, which waits for this, may feed the successor. Caller
// holds applyMu and mu.
func (c *Chain) markSyncedLocked() {
	if c.syncedLocked() {
		return
	}
	c.syncedEpoch = c.epoch
	close(c.syncCh)
	if c.succ == "" {
		c.commitLocked(c.last)
	}
}

// setRoleLocked derives role, pred and succ from order.
func (c *Chain) setRoleLocked() {
	c.role, c.pred, c.succ = RoleNone, "", ""
	i := slices.Index(c.order, c.cfg.NodeAddr)
	if i < 0 {
		return
	}
	if i > 0 {
		c.pred = c.order[i-1]
	}
	if i < len(c.order)-1 {
		c.succ = c.order[i+1]
	}
	switch {
	case i == 0:
		c.role = RoleHead
	case i == len(c.order)-1:
		c.role = RoleTail
	default:
		c.role = RoleMiddle
	}
}

// stopStreamsLocked cancels the sender and every inbound stream; they were
// set up for the previous configuration.
func (c *Chain) stopStreamsLocked() {
	if c.senderStop != nil {
		c.senderStop()
		c.senderStop = nil
	}
	for s := range c.inbound {
		s.cancel()
		delete(c.inbound, s)
	}
}

// Fail stops the replica as a storage failure does (ErrReplicaBroken, with
// cause): it accepts, serves and forwards nothing more, and fails the
// pushes it has waiting as outcome-unknown. Fault-injection tests use it to
// fail a disk on cue; the node reports a broken replica to the metadata
// group, which removes it from the chain.
func (c *Chain) Fail(cause error) error { return c.failStorage(cause) }

// failStorage records a storage failure: from now on the replica accepts
// nothing. It returns the error to report.
func (c *Chain) failStorage(err error) error {
	err = fmt.Errorf("chain %s: %w: %w", c.cfg.ID, ErrReplicaBroken, err)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.broken == nil {
		c.broken = err
		c.log.Error("storage failed; replica stops", "error", err)
		c.stopStreamsLocked()
		c.failWaitingLocked(fmt.Errorf("chain %s: %w: %w", c.cfg.ID, replication.ErrUnknownOutcome, err))
	}
	return c.broken
}

// commitLocked advances the committed index to ix: it answers the head's
// waiting pushes, trims the entry cache, drops dirty marks and wakes the
// stream that acks to the predecessor.
func (c *Chain) commitLocked(ix uint64) {
	if ix <= c.committed {
		return
	}
	c.committed = ix
	c.committedIx.Store(ix)
	c.commitFloor = max(c.commitFloor, ix)
	n := 0
	for _, w := range c.waiting {
		if w.index > ix {
			break
		}
		w.batch.Answer(w.res)
		n++
	}
	clear(c.waiting[:n])
	c.waiting = c.waiting[n:]
	c.trimMemLocked()
	close(c.commitCh)
	c.commitCh = make(chan struct{})
	c.releaseDirty(ix)
}

// failWaitingLocked fails every push waiting for a commit.
func (c *Chain) failWaitingLocked(err error) {
	for _, w := range c.waiting {
		w.batch.Fail(err)
	}
	clear(c.waiting)
	c.waiting = c.waiting[:0]
}

// memKeep is how many committed entries the cache keeps besides the
// uncommitted ones: a successor that reconnects a little behind is served
// from memory.
const memKeep = 64

func (c *Chain) trimMemLocked() {
	keepFrom := c.committed + 1
	if keepFrom > memKeep {
		keepFrom -= memKeep
	} else {
		keepFrom = 1
	}
	if keepFrom <= c.memFirst {
		return
	}
	n := min(int(keepFrom-c.memFirst), len(c.mem))
	clear(c.mem[:n])
	c.mem = c.mem[n:]
	c.memFirst += uint64(n)
}

// markDirtyLocked marks the keys of entry ix dirty (caller holds applyMu).
func (c *Chain) markDirtyLocked(ix uint64, e []byte) {
	keys := replication.PushedKeys(nil, e[entryHeader:], c.cfg.Table.Dim)
	if len(keys) == 0 {
		return
	}
	c.dirtyMu.Lock()
	for _, k := range keys {
		c.dirty[k]++
	}
	c.dirtyLog = append(c.dirtyLog, dirtyEntry{index: ix, keys: keys})
	c.dirtyMu.Unlock()
}

// releaseDirty drops the marks of entries at or below ix.
func (c *Chain) releaseDirty(ix uint64) {
	c.dirtyMu.Lock()
	defer c.dirtyMu.Unlock()
	n := 0
	for _, d := range c.dirtyLog {
		if d.index > ix {
			break
		}
		for _, k := range d.keys {
			if c.dirty[k]--; c.dirty[k] <= 0 {
				delete(c.dirty, k)
			}
		}
		n++
	}
	clear(c.dirtyLog[:n])
	c.dirtyLog = c.dirtyLog[n:]
	if ix >= c.dirtyUntil {
		c.dirtyUntil = 0
	}
}

// appendLocked persists entries first, first+1, ..., applies them and makes
// them available to the sender; on the tail it commits them. head, if set,
// is the head's batch for the single entry, registered to be answered at
// commit. The caller holds applyMu and has checked the configuration.
func (c *Chain) appendLocked(first uint64, entries [][]byte, head *headEntry) error {
	if first != c.last+1 {
		return fmt.Errorf("chain %s: entries from %d do not follow the last applied entry %d", c.cfg.ID, first, c.last)
	}
	if err := c.st.append(first, entries, c.committedIx.Load()); err != nil {
		return c.failStorage(fmt.Errorf("appending entries %d..%d: %w", first, first+uint64(len(entries))-1, err))
	}
	// A tail commits what it applies only once synced (markSyncedLocked);
	// entries only reach one after, but an unsynced tail must not commit.
	tail := c.succ == "" && c.syncedLocked()
	var res *replication.ApplyResult
	for i, e := range entries {
		ix := first + uint64(i)
		if !tail {
			c.markDirtyLocked(ix, e)
		}
		res = c.fsm.ApplyCommand(e[entryHeader:])
		if res.Err() != nil {
			// Every replica decodes the same bytes alike, so this is a bad
			// entry, not a divergence: refused whole, it changed nothing.
			c.log.Warn("bad log entry refused", "index", ix, "error", res.Err())
		}
		c.last, c.lastEpoch = ix, entryEpoch(e)
	}
	c.fsm.SetApplied(c.last)
	c.mu.Lock()
	c.mem = append(c.mem, entries...)
	if head != nil {
		head.index, head.res = c.last, res
		c.waiting = append(c.waiting, head)
	}
	if tail {
		c.commitLocked(c.last)
	}
	close(c.appendCh)
	c.appendCh = make(chan struct{})
	c.mu.Unlock()
	c.sinceSnap += uint64(len(entries))
	if c.sinceSnap >= c.cfg.SnapshotEvery {
		c.maybeSnapshotLocked()
	}
	return nil
}

// maybeSnapshotLocked hands a snapshot of the current state to the
// snapshot goroutine, unless it is still writing the previous one. Taking it
// is O(1) for the table (copy-on-write) plus the dedupe state.
func (c *Chain) maybeSnapshotLocked() {
	if len(c.snapCh) > 0 {
		return
	}
	snap := c.fsm.Snapshot()
	select {
	case c.snapCh <- snapJob{index: c.last, epoch: c.lastEpoch, installs: c.installs, snap: snap}:
		c.sinceSnap = 0
	default:
		snap.Release()
	}
}

// snapshotLoop writes the snapshots appendLocked takes, then deletes the log
// entries at or below both the snapshot and the committed index.
func (c *Chain) snapshotLoop() {
	defer c.wg.Done()
	for {
		select {
		case <-c.closed:
			return
		case job := <-c.snapCh:
			err := c.writeSnapshot(job)
			job.snap.Release()
			if err != nil {
				c.failStorage(err)
			}
		}
	}
}

func (c *Chain) writeSnapshot(job snapJob) error {
	c.snapMu.Lock()
	defer c.snapMu.Unlock()
	// Installs also hold snapMu, so none can come between this check and
	// recording the snapshot.
	c.applyMu.Lock()
	void := job.installs != c.installs
	c.applyMu.Unlock()
	if void {
		return nil
	}
	start, size := time.Now(), int64(0)
	if err := c.st.writeSnapshot(job.index, func(w io.Writer) error {
		var err error
		size, err = job.snap.WriteTo(w)
		return err
	}); err != nil {
		return err
	}
	c.fsm.Metrics().Snapshot(false, size, time.Since(start))
	compactTo := min(job.index, c.committedIx.Load())
	if err := c.st.useSnapshot(job.index, job.epoch, compactTo, false); err != nil {
		return fmt.Errorf("recording snapshot %d: %w", job.index, err)
	}
	c.applyMu.Lock()
	if job.index > c.snapIndex {
		c.snapIndex, c.snapEpoch = job.index, job.epoch
	}
	c.applyMu.Unlock()
	return nil
}
