package shard

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/raftps/raftps/shard/api"

	"github.com/hashicorp/raft"
	"github.com/raftps/raftps/replication"
	"github.com/raftps/raftps/shard/shardpb"
)

// Confirming a chain's epoch before a read.
//
// A chain member holds no lease: the metadata group may remove it at any
// moment (its node went silent, gossip declared it dead), and the rest of the
// chain goes on committing pushes it never sees. A member cut off from the
// cluster but still reached by clients would learn of its removal only when
// its next SetConfig arrives, which a partition delays indefinitely, and it
// would go on serving its old rows: a stale read that a linearizable table
// must never give (raftps chaos on a partitioned chain table found exactly
// that).
//
// So before a linearizable read a member asks the metadata leader for its
// chain's current epoch (ConfirmChains), after the read arrived. If it is
// still the member's own epoch, the member's order was the chain's order at
// some moment after the read began, and every push acknowledged before the
// read began was committed in that epoch or an earlier one, so it reached
// this member (a member that is not caught up sends the read to the tail):
// the read is linearizable. The metadata leader answers once its metadata
// includes every change committed before the question (metaReadIndex).
//
// A bounded(δ) read needs only an answer sent less than δ ago: every push
// acknowledged more than δ before the read was acknowledged before that
// question was sent, and the member had it. Eventual reads confirm nothing.
//
// Cost: a round trip to the metadata leader and a leadership check there
// (a heartbeat round; no log entry) per batch. The questions of every read
// that arrives while one is under way travel together in the next, so a
// node sends at most one at a time whatever its read rate; the metadata
// leader likewise runs one check for every question that arrived while the
// last one ran. And chain reads depend on the metadata group: while it has no
// leader, linearizable chain reads wait (bounded ones within their bound and
// eventual ones do not).

// confirmTimeout bounds one ConfirmChains call. A member that cannot reach
// the metadata leader within it refuses the read as unavailable, and the
// client asks another member.
const confirmTimeout = time.Second

// maxConfirmGroups caps the groups of one ConfirmChains request: a node asks
// for the chains it reads, far fewer.
const maxConfirmGroups = 1 << 16

// coalescer runs fn once for the questions of every caller that arrived
// while the last run was under way: a caller joins the next run, never one
// already started, so the run that answers a caller started after it asked.
type coalescer[Q comparable, A any] struct {
	fn func(qs []Q) (map[Q]A, error)

	mu      sync.Mutex
	running bool
	next    *coalescedRun[Q, A]
}

type coalescedRun[Q comparable, A any] struct {
	qs      map[Q]bool
	done    chan struct{}
	started time.Time
	answers map[Q]A
	err     error
}

// do returns fn's answer to q from a run that started after do was called,
// and when that run started. spawn starts the run's goroutine (Node.spawn,
// so that Close waits for it).
func (c *coalescer[Q, A]) do(ctx context.Context, q Q, spawn func(func()) bool) (A, time.Time, error) {
	var zero A
	c.mu.Lock()
	r := c.next
	if r == nil {
		r = &coalescedRun[Q, A]{qs: map[Q]bool{}, done: make(chan struct{})}
		c.next = r
	}
	r.qs[q] = true
	if !c.running {
		c.running = true
		c.next = nil
		if !spawn(func() { c.loop(r) }) {
			c.running = false
			c.mu.Unlock()
			return zero, time.Time{}, fmt.Errorf("%w: node is closing", api.ErrUnavailable)
		}
	}
	c.mu.Unlock()
	select {
	case <-r.done:
		return r.answers[q], r.started, r.err
	case <-ctx.Done():
		return zero, time.Time{}, ctx.Err()
	}
}

func (c *coalescer[Q, A]) loop(r *coalescedRun[Q, A]) {
	for {
		qs := make([]Q, 0, len(r.qs))
		for q := range r.qs {
			qs = append(qs, q)
		}
		r.started = time.Now()
		r.answers, r.err = c.fn(qs)
		close(r.done)
		c.mu.Lock()
		r = c.next
		c.next = nil
		if r == nil {
			c.running = false
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()
	}
}

// metaReadIndex returns nil once this node, as the metadata leader, has
// applied every metadata change committed before the call: after it, its
// metadata answers as the cluster's would. It is the read-index protocol
// (Raft thesis, 6.4), which writes nothing to the log:
//
//   - once per term, a barrier: a new leader's commit index can lag what
//     earlier leaders committed until an entry of its own term commits, and
//     the barrier is such an entry (its completion also means the FSM has
//     taken in everything before it);
//   - then, per call, the commit index as the call finds it, a leadership
//     check (a heartbeat round that a quorum answers, after the index was
//     read: no other leader can have committed anything since), the same
//     term as before (else it starts over), and a wait until the FSM has
//     taken in that index (meta.FSM.Processed).
//
// The leadership checks of concurrent calls are shared (each call joins a
// check that starts after it read its index), and so are barriers. A wait
// that does not end soon (the FSM was restored from a snapshot, whose index
// it cannot tell) falls back to a barrier.
func (n *Node) metaReadIndex(ctx context.Context) error {
	r := n.meta.Raft
	term := r.CurrentTerm()
	if n.metaReadyTerm.Load() != term {
		if _, _, err := n.metaBarriers.do(ctx, struct{}{}, n.spawn); err != nil {
			return err
		}
		// The barrier ran in term or a later one: a later one only makes
		// the next call run another.
		n.metaReadyTerm.Store(term)
		return nil
	}
	readIx := r.CommitIndex()
	if _, _, err := n.metaVerifies.do(ctx, struct{}{}, n.spawn); err != nil {
		return err
	}
	if r.CurrentTerm() != term {
		// Leadership was lost and won again in between: readIx may be
		// from the new term before its first commit. Start over.
		return n.metaReadIndex(ctx)
	}
	deadline := time.Now().Add(metaApplyWait)
	for wait := 20 * time.Microsecond; n.metaFSM.Processed() < readIx; wait = min(2*wait, time.Millisecond) {
		if time.Now().After(deadline) {
			_, _, err := n.metaBarriers.do(ctx, struct{}{}, n.spawn)
			return err
		}
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// metaApplyWait bounds metaReadIndex's wait for the FSM to take in the commit
// index before it falls back to a barrier. Applying a committed entry takes
// microseconds; the wait is long only when processed cannot tell (after a
// snapshot restore).
const metaApplyWait = 50 * time.Millisecond

func (n *Node) runMetaBarrier([]struct{}) (map[struct{}]struct{}, error) {
	r := n.meta.Raft
	if r.State() != raft.Leader {
		return nil, fmt.Errorf("is not the metadata leader")
	}
	f := r.Barrier(2 * time.Second)
	if err := f.Error(); err != nil {
		return nil, fmt.Errorf("cannot confirm its metadata is current: %w", err)
	}
	if ixf, ok := f.(raft.IndexFuture); ok {
		n.metaFSM.NoteProcessed(ixf.Index()) // the FSM has taken in everything before it
	}
	return nil, nil
}

func (n *Node) runMetaVerify([]struct{}) (map[struct{}]struct{}, error) {
	if err := replication.Await(n.meta.Raft, n.meta.Raft.VerifyLeader()); err != nil {
		return nil, fmt.Errorf("cannot confirm it still leads the metadata group: %w", err)
	}
	return nil, nil
}

// ConfirmChains answers a chain member's question (chainconfirm.go): the
// current epoch of each chain, on the metadata leader's word.
func (s *peerService) ConfirmChains(ctx context.Context, req *shardpb.ConfirmChainsRequest) (*shardpb.ConfirmChainsResponse, error) {
	if len(req.Groups) > maxConfirmGroups {
		return nil, s.n.toStatus(fmt.Errorf("%w: %d chains in one ConfirmChains (at most %d)", api.ErrBadRequest, len(req.Groups), maxConfirmGroups))
	}
	epochs, err := s.n.localChainEpochs(ctx, req.Groups)
	if err != nil {
		return nil, s.n.toStatus(err)
	}
	return &shardpb.ConfirmChainsResponse{Epochs: epochs}, nil
}

// localChainEpochs is ConfirmChains on this node: the epochs of groups if
// this node leads the metadata group, else a NotLeaderError naming the
// leader it knows.
func (n *Node) localChainEpochs(ctx context.Context, groups []string) ([]uint64, error) {
	if err := n.metaReadIndex(ctx); err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%w: confirming chain epochs: %w", api.ErrUnavailable, err)
		}
		return nil, n.notMetaLeader()
	}
	epochs := make([]uint64, len(groups))
	for i, g := range groups {
		if sm := n.metaFSM.ShardMapByID(g); sm != nil {
			epochs[i] = sm.Epoch
		}
	}
	return epochs, nil
}

// chainConfirmer batches a node's epoch questions (see the top of this
// file).
//
// Concurrency: asks coalesces the questions; mu guards last.
type chainConfirmer struct {
	n    *Node
	asks coalescer[string, uint64]

	mu sync.Mutex
	// last is, per group, the newest answer and when its question was sent.
	last map[string]confirmedEpoch
}

type confirmedEpoch struct {
	epoch uint64
	sent  time.Time
}

func newChainConfirmer(n *Node) *chainConfirmer {
	c := &chainConfirmer{n: n, last: map[string]confirmedEpoch{}}
	c.asks.fn = n.chainEpochs
	return c
}

// confirm returns nil if the metadata group's epoch of chain group, at a
// moment after the call (or, with within > 0, after now − within), was
// epoch; api.ErrUnavailable otherwise.
func (c *chainConfirmer) confirm(ctx context.Context, group string, epoch uint64, within time.Duration) error {
	if within > 0 {
		c.mu.Lock()
		l, ok := c.last[group]
		c.mu.Unlock()
		if ok && l.epoch == epoch && time.Since(l.sent) < within {
			return nil
		}
	}
	got, sent, err := c.asks.do(ctx, group, c.n.spawn)
	if err != nil {
		return fmt.Errorf("chain %s: %w: cannot confirm epoch %d with the metadata leader: %w", group, api.ErrUnavailable, epoch, err)
	}
	c.mu.Lock()
	if l, ok := c.last[group]; !ok || l.sent.Before(sent) {
		c.last[group] = confirmedEpoch{epoch: got, sent: sent}
	}
	c.mu.Unlock()
	if got != epoch {
		c.n.kickReconcile()
		return fmt.Errorf("chain %s: %w: this member is in epoch %d but the metadata group is at epoch %d", group, api.ErrUnavailable, epoch, got)
	}
	return nil
}

// chainEpochs asks the metadata leader (this node, or the one it knows) for
// the epochs of groups.
func (n *Node) chainEpochs(groups []string) (map[string]uint64, error) {
	slices.Sort(groups)
	ctx, cancel := context.WithTimeout(context.Background(), confirmTimeout)
	defer cancel()
	go func() { // a closing node does not wait out the timeout
		select {
		case <-n.closed:
			cancel()
		case <-ctx.Done():
		}
	}()
	var epochs []uint64
	err := n.atMetaLeader(func() (err error) {
		epochs, err = n.localChainEpochs(ctx, groups)
		return err
	}, func(ps shardpb.PeerClient, addr raft.ServerAddress) error {
		resp, err := ps.ConfirmChains(ctx, &shardpb.ConfirmChainsRequest{Groups: groups})
		if err != nil {
			return fmt.Errorf("asking metadata leader %s: %w", addr, err)
		}
		if epochs = resp.Epochs; len(epochs) != len(groups) {
			return fmt.Errorf("metadata leader %s answered %d epochs for %d chains", addr, len(epochs), len(groups))
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	out := make(map[string]uint64, len(groups))
	for i, g := range groups {
		out[g] = epochs[i]
	}
	return out, nil
}

// atMetaLeader runs local if this node leads the metadata group as far as
// its replica knows, else remote with a stub of the leader it knows.
func (n *Node) atMetaLeader(local func() error, remote func(ps shardpb.PeerClient, addr raft.ServerAddress) error) error {
	addr, _ := n.meta.Raft.LeaderWithID()
	switch addr {
	case "":
		return errors.New("no metadata leader is known")
	case raft.ServerAddress(n.cfg.PeerAddr):
		return local()
	}
	ps, err := n.peerStub(string(addr))
	if err != nil {
		return err
	}
	return remote(ps, addr)
}
