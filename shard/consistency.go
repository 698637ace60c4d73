package shard

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/raftps/raftps/shard/api"
	"github.com/raftps/raftps/shard/meta"

	"github.com/hashicorp/raft"
	"github.com/raftps/raftps/replication"
	"github.com/raftps/raftps/shard/shardpb"
)

// readLease is what a replica knows about its own freshness: every push
// acknowledged before asOf (this node's monotonic clock) is applied here.
// It is established by a read-index round trip to the shard's leader that
// this node started at asOf (see docs/ARCHITECTURE.md, "Consistency
// levels"): the leader took its commit index after the request arrived, so
// after asOf, and confirmed it still led; this replica then applied that
// index.
type readLease struct {
	g          *replication.Group // the replica it is about; a reopened group gets a new lease
	mu         sync.Mutex
	asOf       time.Time     // zero: never established
	refreshing chan struct{} // non-nil while a refresh runs; closed when it ends
	lastErr    error         // why the last refresh failed, nil if it succeeded
}

// leaseAge is how old a lease established at asOf is, allowing for this
// node's clock running slow.
func leaseAge(asOf, now time.Time) time.Duration {
	return time.Duration(float64(now.Sub(asOf)) * (1 + api.ClockRateAllowance))
}

// lease returns the read lease of g, creating it. A lease belongs to one
// Group object: a replica closed and opened again starts from its
// snapshot, behind what its old lease vouched for, so it gets a new one.
func (n *Node) lease(g *replication.Group) *readLease {
	n.leaseMu.Lock()
	defer n.leaseMu.Unlock()
	l := n.leases[g.ID()]
	if l == nil || l.g != g {
		l = &readLease{g: g}
		n.leases[g.ID()] = l
	}
	return l
}

// dropLease forgets g's lease once g is closed. A read that still holds g
// may create a new one meanwhile; it vouches only for g, which is closed
// and serves nothing, and the next lease(g') replaces it.
func (n *Node) dropLease(g *replication.Group) {
	n.leaseMu.Lock()
	if l := n.leases[g.ID()]; l != nil && l.g == g {
		delete(n.leases, g.ID())
	}
	n.leaseMu.Unlock()
}

// boundedFresh returns nil if this replica of g may serve a read that must
// reflect every push acknowledged more than bound before it began, waiting
// for a lease refresh if the lease is too old. Half-way through a lease's
// life a refresh starts in the background, so a steady stream of reads
// rarely waits.
func (n *Node) boundedFresh(ctx context.Context, g *replication.Group, table string, shard uint32, bound time.Duration) error {
	l := n.lease(g)
	for attempt := 0; ; attempt++ {
		l.mu.Lock()
		now := time.Now()
		if !l.asOf.IsZero() {
			if age := leaseAge(l.asOf, now); age <= bound {
				if age > bound/2 && l.refreshing == nil {
					n.startRefresh(l, g, table, shard, bound)
				}
				l.mu.Unlock()
				return nil
			}
		}
		if attempt > 0 {
			// A refresh ran since this read arrived and did not make the
			// lease fresh enough.
			err := l.lastErr
			l.mu.Unlock()
			if err == nil {
				err = errors.New("the lease expired again at once")
			}
			return fmt.Errorf("group %s: %w: replica on node %s cannot show it is within the %s bound: %v", g.ID(), api.ErrTooStale, n.cfg.ID, bound, err)
		}
		ch := l.refreshing
		if ch == nil {
			ch = n.startRefresh(l, g, table, shard, bound)
		}
		l.mu.Unlock()
		// A refresh that ends later than the bound from now brings a lease
		// already older than the bound (it dates from its request, sent
		// before now): waiting longer is no use. The client asks another
		// replica meanwhile; the refresh goes on for later reads.
		select {
		case <-ch:
		case <-time.After(bound):
			return fmt.Errorf("group %s: %w: replica on node %s has no read lease within the %s bound: the leader's read index takes longer", g.ID(), api.ErrTooStale, n.cfg.ID, bound)
		case <-ctx.Done():
			return fmt.Errorf("group %s: waiting for a read lease: %w", g.ID(), ctx.Err())
		}
	}
}

// startRefresh starts a read-index round trip for l, for reads of the
// given bound; l.mu is held. The round trip is given up after the bound (at
// least minRefreshTimeout): one that takes longer brings a lease already
// too old for those reads, and while it runs no other starts, so one stuck
// on a leader that is gone (frozen, cut off) must not outlast its use.
func (n *Node) startRefresh(l *readLease, g *replication.Group, table string, shard uint32, bound time.Duration) chan struct{} {
	ch := make(chan struct{})
	l.refreshing = ch
	started := n.spawn(func() {
		sent := time.Now()
		err := n.refreshLease(g, table, shard, max(bound, minRefreshTimeout))
		l.mu.Lock()
		if err == nil && sent.After(l.asOf) {
			l.asOf = sent
		}
		l.lastErr = err
		l.refreshing = nil
		l.mu.Unlock()
		close(ch)
	})
	if !started {
		l.lastErr, l.refreshing = fmt.Errorf("node %s is stopping", n.cfg.ID), nil
		close(ch)
	}
	return ch
}

// minRefreshTimeout is the least time a lease refresh is given.
const minRefreshTimeout = 50 * time.Millisecond

// refreshLease gets a read index from g's leader (this replica, if it
// leads) and waits until this replica has applied it, within timeout.
func (n *Node) refreshLease(g *replication.Group, table string, shard uint32, timeout time.Duration) error {
	ctx, cancel := n.callContext(timeout, nil)
	defer cancel()
	var ix uint64
	// A dormant group has no leader to give a read index; this replica
	// elects one unless it names a former leader that is alive (whose
	// ReadIndex then wakes it).
	g.Awaken(ctx)
	if g.Raft().State() == raft.Leader {
		var err error
		if ix, err = g.ReadIndex(ctx); err != nil {
			return err
		}
	} else {
		addr, id := g.Raft().LeaderWithID()
		if addr == "" {
			return fmt.Errorf("no leader known")
		}
		ps, err := n.peerStub(string(addr))
		if err != nil {
			return err
		}
		resp, err := ps.ReadIndex(ctx, &shardpb.ReadIndexRequest{Table: table, Shard: shard})
		if err != nil {
			return fmt.Errorf("read index from leader %s: %w", id, fromStatus(err))
		}
		ix = resp.Index
	}
	return g.WaitApplied(ctx, ix)
}

// callContext bounds a call this node makes on its own behalf: it ends
// after timeout, when the node closes, or when stop (if not nil) closes.
func (n *Node) callContext(timeout time.Duration, stop <-chan struct{}) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	go func() {
		select {
		case <-n.closed:
		case <-stop: // nil: never
		case <-ctx.Done():
		}
		cancel()
	}()
	return ctx, cancel
}

func (s *peerService) ReadIndex(ctx context.Context, req *shardpb.ReadIndexRequest) (*shardpb.ReadIndexResponse, error) {
	g := s.n.Group(req.Table, req.Shard)
	if g == nil {
		return nil, s.n.toStatus(fmt.Errorf("group %s: %w: no replica on node %s", api.GroupID(req.Table, req.Shard), api.ErrNotReplica, s.n.cfg.ID))
	}
	ix, err := g.ReadIndex(ctx)
	if err != nil {
		return nil, s.n.toStatus(err)
	}
	return &shardpb.ReadIndexResponse{Index: ix}, nil
}

func (s *service) AlterTable(ctx context.Context, req *shardpb.AlterTableRequest) (*shardpb.AlterTableResponse, error) {
	if req.Name == "" {
		return nil, s.n.toStatus(fmt.Errorf("%w: no table name", api.ErrBadRequest))
	}
	return onMetaLeader(ctx, s.n, func() (*shardpb.AlterTableResponse, error) { return s.n.alterTable(req) },
		&shardpb.ForwardRequest{Call: &shardpb.ForwardRequest_AlterTable{AlterTable: req}}, (*shardpb.ForwardResponse).GetAlterTable)
}

func (n *Node) alterTable(req *shardpb.AlterTableRequest) (*shardpb.AlterTableResponse, error) {
	if err := n.metaAuthoritative(); err != nil {
		return nil, fmt.Errorf("altering table %q: %w: %v", req.Name, api.ErrUnavailable, err)
	}
	spec := n.metaFSM.Table(req.Name)
	if spec == nil {
		return nil, fmt.Errorf("table %q: %w", req.Name, api.ErrUnknownTable)
	}
	next, err := api.AlterSpec(spec, req)
	if err != nil {
		return nil, err
	}
	out, err := n.applyMeta(meta.CmdAlterTable, next, fmt.Sprintf("altering table %q", req.Name))
	if err != nil {
		return nil, err
	}
	return &shardpb.AlterTableResponse{Spec: out.(*shardpb.TableSpec)}, nil
}

// Roles and levels of the served-pull counters.
const (
	roleLeader = iota
	roleFollower
	roleReadReplica
	numRoles
)

var roleNames = [numRoles]string{"leader", "follower", "read-replica"}

// servedCounters counts the pulls a node served, by role and level
// (api.LevelRank - 1).
type servedCounters struct {
	c [numRoles][3]struct{ requests, rows, refused atomic.Uint64 }
}

func (s *servedCounters) served(role int, level shardpb.Consistency, rows int) {
	if r := api.LevelRank(level); r > 0 {
		c := &s.c[role][r-1]
		c.requests.Add(1)
		c.rows.Add(uint64(rows))
	}
}

func (s *servedCounters) refused(role int, level shardpb.Consistency) {
	if r := api.LevelRank(level); r > 0 {
		s.c[role][r-1].refused.Add(1)
	}
}

// snapshot returns the non-zero counters.
func (s *servedCounters) snapshot() []*shardpb.ServedCount {
	var out []*shardpb.ServedCount
	levels := []shardpb.Consistency{shardpb.Consistency_CONSISTENCY_EVENTUAL, shardpb.Consistency_CONSISTENCY_BOUNDED, shardpb.Consistency_CONSISTENCY_LINEARIZABLE}
	for role := range numRoles {
		for l, level := range levels {
			c := &s.c[role][l]
			sc := &shardpb.ServedCount{Role: roleNames[role], Level: api.LevelName(level), Requests: c.requests.Load(), Rows: c.rows.Load(), Refused: c.refused.Load()}
			if sc.Requests+sc.Refused > 0 {
				out = append(out, sc)
			}
		}
	}
	return out
}

// Served returns the pulls this node served, by role and level, as its
// Status answers them.
func (n *Node) Served() []*shardpb.ServedCount { return n.served.snapshot() }
