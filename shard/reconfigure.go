package shard

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/raftps/raftps/shard/api"

	"github.com/hashicorp/raft"
	"github.com/raftps/raftps/replication"
	"github.com/raftps/raftps/shard/shardpb"
)

// Shard group membership changes, carried out by the group's leader on the
// scheduler's request (Reconfigure). Adding a replica is two Raft
// configuration changes with a catch-up between them: the node joins as a
// non-voter, receives a snapshot and the log, and is made a voter only once
// it has applied what was committed when it joined, so the group's quorum
// never waits on a replica that has nothing yet. Removing one is one change;
// a leader asked to remove itself hands leadership over first.

// configChangeTimeout bounds one Raft configuration change.
const configChangeTimeout = 10 * time.Second

func (s *peerService) Reconfigure(ctx context.Context, req *shardpb.ReconfigureRequest) (*shardpb.ReconfigureResponse, error) {
	n := s.n
	g := n.Group(req.Table, req.Shard)
	if g == nil {
		return nil, s.n.toStatus(fmt.Errorf("group %s: %w: no replica open on node %s", api.GroupID(req.Table, req.Shard), api.ErrNotReplica, n.cfg.ID))
	}
	// A change decided from an older map entry than this node has is
	// refused: its scheduler (a deposed metadata leader, or a round that
	// read the map before another step changed it) works from a stale view.
	// This node's map may itself lag; that only narrows the check.
	if sm := n.metaFSM.ShardMap(req.Table, req.Shard); req.Epoch != 0 && sm != nil && sm.Epoch > req.Epoch {
		return nil, s.n.toStatus(fmt.Errorf("group %s: %w: the change was decided at epoch %d, node %s has %d", g.ID(), api.ErrEpochChanged, req.Epoch, n.cfg.ID, sm.Epoch))
	}
	if req.Op != shardpb.ReconfigureOp_RECONFIGURE_QUERY {
		// A membership change needs the group's leader; a dormant group
		// has none until asked.
		g.Awaken(ctx)
	}
	var err error
	switch req.Op {
	case shardpb.ReconfigureOp_RECONFIGURE_QUERY:
	case shardpb.ReconfigureOp_RECONFIGURE_ADD:
		err = n.addReplica(ctx, g, req.Table, req.Shard, req.NodeId, req.NodeAddr)
	case shardpb.ReconfigureOp_RECONFIGURE_REMOVE:
		err = n.removeReplica(g, req.NodeId)
	default:
		err = fmt.Errorf("%w: reconfigure operation %v", api.ErrBadRequest, req.Op)
	}
	if err != nil {
		return nil, s.n.toStatus(err)
	}
	resp, err := groupView(g.Raft())
	return resp, n.toStatus(err)
}

// groupView is a replica's view of its group. A replica that believes it
// leads says "leader" only after confirming it with a quorum
// (VerifyLeader): a deposed leader that has not noticed would otherwise
// report a configuration that is no longer current, and a node deciding
// whether it may delete its data (gcRetired) would trust it.
func groupView(r *raft.Raft) (*shardpb.ReconfigureResponse, error) {
	addr, id := r.LeaderWithID()
	state := r.State()
	if state == raft.Leader && replication.Await(r, r.VerifyLeader()) != nil {
		state, addr, id = raft.Follower, "", ""
	}
	resp := &shardpb.ReconfigureResponse{State: stateName(state), AppliedIndex: r.AppliedIndex(), LeaderId: string(id), LeaderAddr: string(addr)}
	f := r.GetConfiguration()
	if err := f.Error(); err != nil {
		return nil, fmt.Errorf("%w: reading the group configuration: %v", api.ErrUnavailable, err)
	}
	for _, srv := range f.Configuration().Servers {
		if srv.Suffrage == raft.Voter {
			resp.Voters = append(resp.Voters, string(srv.ID))
		} else {
			resp.Nonvoters = append(resp.Nonvoters, string(srv.ID))
		}
	}
	return resp, nil
}

func suffrageOf(r *raft.Raft, id string) (raft.ServerSuffrage, bool, error) {
	f := r.GetConfiguration()
	if err := f.Error(); err != nil {
		return 0, false, err
	}
	for _, srv := range f.Configuration().Servers {
		if string(srv.ID) == id {
			return srv.Suffrage, true, nil
		}
	}
	return 0, false, nil
}

func notLeaderOf(g *replication.Group) error {
	addr, id := g.Raft().LeaderWithID()
	return &replication.NotLeaderError{Group: g.ID(), LeaderID: id, LeaderAddr: addr}
}

// addReplica makes node id (at addr) a caught-up voter of g, which this node
// must lead. Idempotent: a voter already is done; a non-voter resumes
// catching up.
func (n *Node) addReplica(ctx context.Context, g *replication.Group, table string, shard uint32, id, addr string) error {
	r := g.Raft()
	if id == "" || addr == "" {
		return fmt.Errorf("%w: adding a replica needs the node's ID and address", api.ErrBadRequest)
	}
	if r.State() != raft.Leader {
		return notLeaderOf(g)
	}
	suf, in, err := suffrageOf(r, id)
	if err != nil {
		return fmt.Errorf("group %s: %w: %v", g.ID(), api.ErrUnavailable, err)
	}
	if in && suf == raft.Voter {
		return nil
	}
	// The new node opens its replica once its metadata shows it being
	// added; until then Raft's messages to it fail and back off, up to
	// seconds. Wait for it instead.
	query := func() (*shardpb.ReconfigureResponse, error) {
		ps, err := n.peerStub(addr)
		if err != nil {
			return nil, err
		}
		qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		return ps.Reconfigure(qctx, &shardpb.ReconfigureRequest{Table: table, Shard: shard, Op: shardpb.ReconfigureOp_RECONFIGURE_QUERY})
	}
	if err := pollUntil(ctx, 50*time.Millisecond, func() (bool, error) {
		_, err := query()
		return err == nil, nil
	}); err != nil {
		return fmt.Errorf("group %s: %w: node %s did not open its replica: %w", g.ID(), api.ErrUnavailable, id, err)
	}
	if !in {
		if err := r.AddNonvoter(raft.ServerID(id), raft.ServerAddress(addr), 0, configChangeTimeout).Error(); err != nil {
			return fmt.Errorf("group %s: adding %s as a non-voter: %w", g.ID(), id, raftChangeErr(g, err))
		}
	}
	target := r.CommitIndex()
	if err := pollUntil(ctx, 100*time.Millisecond, func() (bool, error) {
		if r.State() != raft.Leader {
			return false, notLeaderOf(g)
		}
		v, err := query()
		return err == nil && v.AppliedIndex >= target, nil
	}); err != nil {
		return fmt.Errorf("group %s: %w: node %s did not catch up to index %d: %w", g.ID(), api.ErrUnavailable, id, target, err)
	}
	if err := r.AddVoter(raft.ServerID(id), raft.ServerAddress(addr), 0, configChangeTimeout).Error(); err != nil {
		return fmt.Errorf("group %s: making %s a voter: %w", g.ID(), id, raftChangeErr(g, err))
	}
	return nil
}

// removeReplica removes node id from g, which this node must lead. If id is
// this node, it hands leadership to another voter and answers NotLeader:
// the caller asks the new leader.
func (n *Node) removeReplica(g *replication.Group, id string) error {
	r := g.Raft()
	if r.State() != raft.Leader {
		return notLeaderOf(g)
	}
	_, in, err := suffrageOf(r, id)
	if err != nil {
		return fmt.Errorf("group %s: %w: %v", g.ID(), api.ErrUnavailable, err)
	}
	if !in {
		return nil
	}
	if id == n.cfg.ID {
		if err := replication.Await(r, g.TransferLeadership("", "")); err != nil {
			return fmt.Errorf("group %s: %w: handing leadership over before removing %s: %v", g.ID(), api.ErrUnavailable, id, err)
		}
		return notLeaderOf(g)
	}
	if err := r.RemoveServer(raft.ServerID(id), 0, configChangeTimeout).Error(); err != nil {
		return fmt.Errorf("group %s: removing %s: %w", g.ID(), id, raftChangeErr(g, err))
	}
	return nil
}

// raftChangeErr classifies a failed configuration change: lost leadership
// is NotLeader, anything else unavailable (retryable).
func raftChangeErr(g *replication.Group, err error) error {
	if errors.Is(err, raft.ErrNotLeader) || errors.Is(err, raft.ErrLeadershipLost) {
		return notLeaderOf(g)
	}
	return fmt.Errorf("%w: %v", api.ErrUnavailable, err)
}

// pollUntil calls cond every interval until it reports done or fails, or
// ctx ends.
func pollUntil(ctx context.Context, interval time.Duration, cond func() (bool, error)) error {
	for {
		done, err := cond()
		if err != nil {
			return err
		}
		if done {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(interval):
		}
	}
}
