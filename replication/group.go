package replication

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	"github.com/raftps/raftps/store"
)

// GroupConfig configures one replica of one shard group. Zero fields get the
// defaults of DefaultRaftConfig and DefaultGroupConfig.
type GroupConfig struct {
	RaftConfig
	// Table is the shard's table config; every replica must have the same.
	Table store.TableConfig
	// MaxEntryBytes caps one log entry (a batch of pushes); a single push
	// larger than this is rejected. MaxInflight entries may be uncommitted at
	// once; pushes arriving meanwhile form the next entry.
	MaxEntryBytes int
	MaxInflight   int
	// ApplyTimeout bounds how long a push waits to be enqueued into Raft.
	ApplyTimeout time.Duration
	// DedupeTTL: see DefaultDedupeTTL.
	DedupeTTL time.Duration
}

// DefaultGroupConfig returns the defaults of the shard-specific settings.
func DefaultGroupConfig() GroupConfig {
	return GroupConfig{
		RaftConfig:    DefaultRaftConfig(),
		MaxEntryBytes: MaxGroupEntryBytes,
		MaxInflight:   4,
		ApplyTimeout:  5 * time.Second,
		DedupeTTL:     DefaultDedupeTTL,
	}
}

func (c GroupConfig) withDefaults() GroupConfig {
	d := DefaultGroupConfig()
	c.RaftConfig = c.RaftConfig.withDefaults()
	if c.ApplyTimeout == 0 {
		c.ApplyTimeout = d.ApplyTimeout
	}
	if c.DedupeTTL == 0 {
		c.DedupeTTL = d.DedupeTTL
	}
	if c.MaxEntryBytes == 0 {
		c.MaxEntryBytes = d.MaxEntryBytes
	}
	if c.MaxInflight == 0 {
		c.MaxInflight = d.MaxInflight
	}
	return c
}

func (c GroupConfig) validate() error {
	if err := c.RaftConfig.validate(); err != nil {
		return err
	}
	switch {
	case c.MaxEntryBytes < 1024 || c.MaxEntryBytes > MaxGroupEntryBytes:
		return fmt.Errorf("group %q: invalid config: MaxEntryBytes = %d (want 1024 to %d)", c.ID, c.MaxEntryBytes, MaxGroupEntryBytes)
	case c.MaxInflight < 1:
		return fmt.Errorf("group %q: invalid config: MaxInflight = %d (want at least 1)", c.ID, c.MaxInflight)
	}
	return c.Table.Validate()
}

// Group is one replica of one shard: a Raft instance whose FSM is the
// shard's store.Table.
//
// Concurrency: Push, Pull and the accessors are safe for concurrent use.
// Pushes are funnelled to one batcher goroutine; linearizable reads to one
// verifier goroutine. Close stops both and Raft.
type Group struct {
	cfg     GroupConfig
	who     string // "group ID", for errors
	replica *RaftReplica
	raft    *raft.Raft
	fsm     *FSM
	batcher *Batcher

	// readyTerm is the term in which this replica, as leader, has applied
	// everything committed before its term (a Barrier completed); 0 if none.
	readyTerm atomic.Uint64

	verifyMu   sync.Mutex
	verifyWait []verifyWaiter // reads waiting for the next leadership check
	verifyKick chan struct{}
	// slowChecks counts the leadership checks in a row, in this replica's
	// current leadership, that took over half the heartbeat timeout
	// (SlowLeader). Only verifyLoop and becomeReady write it.
	slowChecks atomic.Int32

	closeOnce sync.Once
	closed    chan struct{}
	wg        sync.WaitGroup
}

// OpenGroup starts a replica. If Dir holds Raft state the replica resumes
// from it (restoring the latest snapshot and replaying the log); otherwise, if
// Peers is set, it bootstraps a new group with them.
func OpenGroup(cfg GroupConfig) (*Group, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	f, err := NewFSM(cfg.ID, cfg.Table, cfg.DedupeTTL)
	if err != nil {
		return nil, fmt.Errorf("group %s: %w", cfg.ID, err)
	}
	f.SetMetrics(cfg.Metrics)
	rep, err := OpenRaft(cfg.RaftConfig, raftFSM{FSM: f, log: cfg.Logger})
	if err != nil {
		return nil, err
	}
	g := &Group{
		cfg: cfg, who: "group " + cfg.ID, replica: rep, raft: rep.Raft, fsm: f,
		verifyKick: make(chan struct{}, 1),
		closed:     make(chan struct{}),
	}
	g.batcher = NewBatcher(BatcherConfig{Who: g.who, MaxEntryBytes: cfg.MaxEntryBytes, MaxInflight: cfg.MaxInflight, Closed: g.closed})
	g.wg.Add(3)
	go g.watchLeadership()
	go g.batchLoop()
	go g.verifyLoop()
	return g, nil
}

// ID returns the group's ID.
func (g *Group) ID() string { return g.cfg.ID }

// Raft returns the group's Raft instance, for membership changes and status.
func (g *Group) Raft() *raft.Raft { return g.raft }

// Replica returns the group's Raft instance with its stores.
func (g *Group) Replica() *RaftReplica { return g.replica }

// Table returns the table the replica currently serves (it changes when a
// snapshot is restored).
func (g *Group) Table() *store.Table { return g.fsm.Table() }

// AppliedIndex returns the index of the last log entry applied to the table.
func (g *Group) AppliedIndex() uint64 { return g.fsm.AppliedIndex() }

// IsLeader reports whether this replica is the leader.
func (g *Group) IsLeader() bool { return g.raft.State() == raft.Leader }

// Close shuts the replica down; pending pushes fail with ErrGroupClosed.
func (g *Group) Close() error {
	var err error
	g.closeOnce.Do(func() {
		close(g.closed)
		g.replica.closeTransport()
		err = g.raft.Shutdown().Error()
		g.wg.Wait()
		if cerr := g.replica.Close(); err == nil {
			err = cerr
		}
		// Fail what the batcher never took.
		g.batcher.Drain()
	})
	return err
}

func (g *Group) closedErr() error { return fmt.Errorf("group %s: %w", g.cfg.ID, ErrGroupClosed) }

func (g *Group) notLeader() error {
	addr, id := g.raft.LeaderWithID()
	return &NotLeaderError{Group: g.cfg.ID, LeaderID: id, LeaderAddr: addr}
}

// watchLeadership marks the replica ready for linearizable reads once, as
// leader, it has applied everything committed before its term: a new leader's
// commit index may lag until an entry of its own term commits. The entry is
// our noop command, not a raft Barrier, so that the FSM sees its index (see
// cmdNoop); the group issues no Barriers, so every later entry is seen too.
func (g *Group) watchLeadership() {
	defer g.wg.Done()
	for {
		select {
		case <-g.closed:
			return
		case leader := <-g.raft.LeaderCh():
			g.readyTerm.Store(0)
			if !leader {
				continue
			}
			g.cfg.Metrics.becameLeader()
			g.becomeReady()
		}
	}
}

// becomeReady commits a noop of the current term and marks the term ready for
// reads. A failed noop (a slow disk, say) is retried while this replica leads
// in the same term: without it, linearizable reads would be refused until the
// next election. A later term gets its own notification.
func (g *Group) becomeReady() {
	term := g.raft.CurrentTerm()
	for g.raft.State() == raft.Leader && g.raft.CurrentTerm() == term {
		err := g.futureError(g.raft.Apply([]byte{cmdNoop}, g.cfg.ApplyTimeout))
		if err == nil {
			if g.raft.State() == raft.Leader && g.raft.CurrentTerm() == term {
				g.slowChecks.Store(0)
				g.readyTerm.Store(term)
			}
			return
		}
		if errors.Is(err, ErrGroupClosed) {
			return
		}
		g.cfg.Logger.Warn("noop after election failed; retrying", "group", g.cfg.ID, "term", term, "error", err)
		select {
		case <-g.closed:
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// futureError waits for f, or for the group to close. hashicorp/raft may drop
// a future at shutdown without answering it (an entry committed but still
// queued for the FSM), so waiting on f alone could make Close wait for ever.
// The goroutine that waits on f is not counted in g.wg: if raft never answers
// it stays parked, one per dropped future, which only happens at shutdown.
func (g *Group) futureError(f raft.Future) error {
	ch := make(chan error, 1)
	go func() { ch <- f.Error() }()
	select {
	case err := <-ch:
		return err
	case <-g.closed:
		return g.closedErr()
	}
}

// Push applies p through the group's log and returns once it is applied on
// the leader (and committed on a majority). duplicate is true if this
// (client, seq) had been applied before; the push is then not applied again.
//
// The caller's slices are copied before Push returns. On ErrNotLeader the
// push was not logged; on ErrUnknownOutcome (or a context error) it may have
// been: retry with the same (client, seq) either way.
func (g *Group) Push(ctx context.Context, p *Push) (duplicate bool, err error) {
	if err := g.batcher.Check(g.Table(), p); err != nil {
		return false, err
	}
	g.Awaken(ctx)
	if g.raft.State() != raft.Leader {
		return false, g.notLeader()
	}
	return g.batcher.Submit(ctx, p)
}

// batchLoop turns queued pushes into log entries: group commit. It waits for
// a free in-flight slot before draining the queue, so while Raft is busy the
// pushes that arrive wait together and go out as one entry.
func (g *Group) batchLoop() {
	defer g.wg.Done()
	for {
		batch, ok := g.batcher.Next()
		if !ok {
			return
		}
		cmd := batch.AppendCommand(nil, time.Now().UnixNano())
		future := g.raft.Apply(cmd, g.cfg.ApplyTimeout)
		g.wg.Add(1)
		go g.complete(future, batch)
	}
}

// complete hands each push of a logged batch its outcome.
func (g *Group) complete(f raft.ApplyFuture, batch *Batch) {
	defer g.wg.Done()
	if err := g.futureError(f); err != nil {
		if errors.Is(err, raft.ErrNotLeader) { // refused before it was logged
			batch.Fail(g.notLeader())
		} else {
			batch.Fail(fmt.Errorf("group %s: %w: %w", g.cfg.ID, ErrUnknownOutcome, err))
		}
		return
	}
	res, ok := f.Response().(*ApplyResult)
	if !ok {
		batch.Fail(fmt.Errorf("group %s: log entry answered %T", g.cfg.ID, f.Response()))
		return
	}
	batch.Answer(res)
}

// Pull copies the rows of keys into out (len(keys) × dim values). With
// linearizable, the leader answers only after confirming it is still leader
// and that it has applied every entry committed before the call (the read
// index); otherwise the replica answers from what it has applied.
//
// Why the read index is correct without a ReadIndex API in hashicorp/raft:
// (1) readyTerm shows this leader has applied an entry of its own term, so its
// commit index is at least that of any earlier leader; (2) the commit index is
// read before the leadership check; (3) the check (confirmLeadership: a
// majority answers, in this term, heartbeats or term checks sent after the
// read began) shows
// that no leader of a later term was elected, so none acknowledged a write,
// before the read began, and no write acknowledged before then can be above
// that commit index;
// (4) waiting until the FSM has applied that index makes every such write
// visible.
func (g *Group) Pull(ctx context.Context, keys []uint64, out []float32, linearizable bool) error {
	if linearizable {
		if err := g.readIndex(ctx); err != nil {
			return err
		}
	}
	if err := g.Table().Lookup(keys, out); err != nil {
		return fmt.Errorf("group %s: %w", g.cfg.ID, err)
	}
	return nil
}

func (g *Group) readIndex(ctx context.Context) error {
	ix, err := g.ReadIndex(ctx)
	if err != nil {
		return err
	}
	return g.fsm.waitApplied(ctx, ix)
}

// ReadIndex is the leader's half of a read: it takes the commit index, then
// confirms that it still leads (a heartbeat round to a majority, shared with
// the reads queued beside it). Every write acknowledged before the call is
// at or below the index it returns, on any replica: a follower that has
// applied it can serve a read that must reflect those writes.
func (g *Group) ReadIndex(ctx context.Context) (uint64, error) {
	g.Awaken(ctx)
	g.replica.touch()
	if g.raft.State() != raft.Leader {
		return 0, g.notLeader()
	}
	if term := g.readyTerm.Load(); term == 0 || term != g.raft.CurrentTerm() {
		return 0, fmt.Errorf("group %s: %w: still applying the log of earlier terms", g.cfg.ID, ErrLeaderNotReady)
	}
	term := g.readyTerm.Load()
	ix := g.raft.CommitIndex()
	ch := make(chan error, 1)
	g.verifyMu.Lock()
	g.verifyWait = append(g.verifyWait, verifyWaiter{term: term, ch: ch})
	g.verifyMu.Unlock()
	select {
	case g.verifyKick <- struct{}{}:
	default:
	}
	select {
	case err := <-ch:
		if err != nil {
			switch {
			case errors.Is(err, ErrNotLeader) || errors.Is(err, ErrLeaderNotReady) || errors.Is(err, ErrGroupClosed):
				return 0, err
			case errors.Is(err, raft.ErrNotLeader) || errors.Is(err, raft.ErrLeadershipLost):
				return 0, g.notLeader()
			case errors.Is(err, raft.ErrRaftShutdown) || errors.Is(err, ErrGroupClosed):
				return 0, g.closedErr()
			case errors.Is(err, raft.ErrLeadershipTransferInProgress):
				return 0, fmt.Errorf("group %s: %w: leadership transfer in progress", g.cfg.ID, ErrLeaderNotReady)
			}
			return 0, fmt.Errorf("group %s: verifying leadership: %w", g.cfg.ID, err)
		}
	case <-ctx.Done():
		return 0, fmt.Errorf("group %s: verifying leadership: %w", g.cfg.ID, ctx.Err())
	case <-g.closed:
		return 0, g.closedErr()
	}
	return ix, nil
}

// slowLeaderChecks is how many leadership checks in a row must be slow
// before SlowLeader says so: one slow round is a hiccup (a pause of the
// collector, a burst of load), several are a slow machine or link.
const slowLeaderChecks = 3

// SlowLeader reports whether this replica leads and its last leadership
// checks (the heartbeat round of every read index it serves) each took
// more than half the heartbeat timeout. Such a leader holds on to its
// leadership (its appends still flow, so its lease stays fresh), yet every
// read that needs it waits: a follower's bounded-read lease needs a read
// index in a round trip shorter than the bound, so while it leads no
// replica can serve a tight bound at all. Its node hands leadership over.
func (g *Group) SlowLeader() bool {
	return g.IsLeader() && g.slowChecks.Load() >= slowLeaderChecks
}

// WaitApplied returns once this replica has applied index ix, or ctx ends.
func (g *Group) WaitApplied(ctx context.Context, ix uint64) error {
	return g.fsm.waitApplied(ctx, ix)
}

// verifyLoop runs one leadership check for every read that queued before the
// check started; reads that queue during a check wait for the next one. So a
// burst of reads costs one heartbeat round, and every read's check starts
// after it took its read index.
func (g *Group) verifyLoop() {
	defer g.wg.Done()
	for {
		select {
		case <-g.verifyKick:
		case <-g.closed:
			g.verifyMu.Lock()
			for _, w := range g.verifyWait {
				w.ch <- g.closedErr()
			}
			g.verifyWait = nil
			g.verifyMu.Unlock()
			return
		}
		g.verifyMu.Lock()
		waiting := g.verifyWait
		g.verifyWait = nil
		g.verifyMu.Unlock()
		if len(waiting) == 0 {
			continue
		}
		term := g.raft.CurrentTerm()
		start := time.Now()
		err := g.confirmLeadership(term)
		if err == nil {
			if time.Since(start) > g.cfg.HeartbeatTimeout/2 {
				g.slowChecks.Add(1)
			} else {
				g.slowChecks.Store(0)
			}
		}
		for _, w := range waiting {
			if err == nil && w.term != term {
				w.ch <- g.notLeader() // leadership changed since the read began
				continue
			}
			w.ch <- err
		}
	}
}

// verifyWaiter is a read waiting for a leadership check: the term it was
// ready in, and where to answer.
type verifyWaiter struct {
	term uint64
	ch   chan error
}

// confirmLeadership returns nil once a majority of the voters, this replica
// included, answered a heartbeat of term, or a term check with term, that
// was sent after the call: each such follower was still in term when it
// answered, after the read began, so no leader of a later term can have
// been elected (it needs a majority, which would include one of them) and
// acknowledged a write before the read began.
//
// hashicorp/raft's VerifyLeader is not used: it counts any answer that
// arrives after it was called, including the answer to a heartbeat or append
// sent before, and such an answer, delayed in the network, could vouch for a
// leader deposed in the meantime. A peer that answers term checks gets one
// (transport_confirm.go), which it answers without raft; others, and one
// still in an older term, get an ordinary heartbeat (term and leader
// only), which followers already receive every few tens of milliseconds.
// Both travel through the transport's per-peer coalescer.
func (g *Group) confirmLeadership(term uint64) error {
	self := g.cfg.NodeID
	leaderAddr, leaderID := g.raft.LeaderWithID()
	if leaderID != self || g.raft.CurrentTerm() != term {
		return g.notLeader()
	}
	var peers []raft.Server
	voters := 0
	for _, s := range g.raft.GetConfiguration().Configuration().Servers {
		if s.Suffrage != raft.Voter {
			continue
		}
		voters++
		if s.ID != self {
			peers = append(peers, s)
		}
	}
	need := voters/2 + 1 - 1 // this replica is one of the majority
	if need <= 0 {
		return nil
	}
	tr := g.cfg.Transport
	send := tr.AppendEntries
	mt, _ := tr.(*Transport)
	if mt != nil {
		send = mt.heartbeatNow
	}
	req := &raft.AppendEntriesRequest{
		RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte(self), Addr: tr.EncodePeer(self, leaderAddr)},
		Term:      term,
	}
	// Buffered for every peer: the goroutines of peers that answer after
	// the majority did (or never, until the transport's timeout) finish on
	// their own.
	results := make(chan *raft.AppendEntriesResponse, len(peers))
	for _, p := range peers {
		go func() {
			if mt != nil {
				// A term check, which the peer answers without raft
				// (transport_confirm.go), if it takes them and is in a
				// term as new as this one; a heartbeat otherwise.
				peerTerm, ok, err := mt.checkTerm(p.Address, self, req.Addr, term)
				switch {
				case ok && err != nil:
					results <- nil
					return
				case ok && peerTerm >= term:
					results <- &raft.AppendEntriesResponse{Term: peerTerm, Success: peerTerm == term}
					return
				}
			}
			var resp raft.AppendEntriesResponse
			if err := send(p.ID, p.Address, req, &resp); err != nil {
				results <- nil
				return
			}
			results <- &resp
		}()
	}
	confirmed, failed, newer := 0, 0, false
	for range peers {
		select {
		case r := <-results:
			switch {
			case r != nil && r.Success && r.Term == term:
				confirmed++
			case r != nil && r.Term > term:
				newer = true
				failed++
			default:
				failed++
			}
		case <-g.closed:
			return g.closedErr()
		}
		if confirmed >= need {
			return nil
		}
		if failed > len(peers)-need {
			break
		}
	}
	if newer {
		return g.notLeader()
	}
	return fmt.Errorf("group %s: %w: leadership in term %d not confirmed by a majority", g.cfg.ID, ErrLeaderNotReady, term)
}
