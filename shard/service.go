package shard

import (
	"context"
	"fmt"
	"time"

	"github.com/hashicorp/raft"
	"github.com/raftps/raftps/replication"
	"github.com/raftps/raftps/shard/shardpb"
	"github.com/raftps/raftps/store"
)

// service implements shardpb.ParameterServerServer. Each handler checks the
// request, calls the node or the group, and converts the error (toStatus is
// the only place errors become gRPC codes).
type service struct {
	shardpb.UnimplementedParameterServerServer
	n *Node
}

// lookupSpec returns the table's spec. A node that does not know the table
// answers "unknown" only when its metadata is authoritative: as the metadata
// leader after a barrier, or as a follower that has applied everything
// committed and heard from the leader lately. Otherwise (just restarted, say)
// it answers with a retryable error: for metadata requests a hint to the
// metadata leader, for data requests ErrUnavailable.
func (n *Node) lookupSpec(name string, metaRequest bool) (*shardpb.TableSpec, error) {
	if spec := n.metaFSM.table(name); spec != nil {
		return spec, nil
	}
	if err := n.metaAuthoritative(); err != nil {
		if metaRequest {
			addr, id := n.meta.Raft.LeaderWithID()
			return nil, &replication.NotLeaderError{Group: metaGroupID, LeaderID: id, LeaderAddr: addr}
		}
		return nil, fmt.Errorf("table %q: %w: node %s %v", name, ErrUnavailable, n.cfg.ID, err)
	}
	if spec := n.metaFSM.table(name); spec != nil {
		return spec, nil
	}
	return nil, fmt.Errorf("table %q: %w", name, store.ErrUnknownTable)
}

// metaAuthoritative returns nil if this node's metadata includes every
// committed change, or why it may not.
func (n *Node) metaAuthoritative() error {
	r := n.meta.Raft
	if r.State() == raft.Leader {
		if err := r.Barrier(2 * time.Second).Error(); err != nil {
			return fmt.Errorf("cannot confirm its metadata is current: %w", err)
		}
		return nil
	}
	if time.Since(r.LastContact()) > time.Second {
		return fmt.Errorf("has not heard from the metadata leader lately")
	}
	// Not just the commit index: pure heartbeats carry none, so a follower
	// restarted a moment ago has heard from the leader but not yet learnt what
	// is committed. Everything in its log must be applied.
	if r.AppliedIndex() < r.LastIndex() || r.AppliedIndex() < r.CommitIndex() {
		return fmt.Errorf("is still applying metadata")
	}
	return nil
}

// groupFor finds this node's replica of table/shard and the table's spec.
func (n *Node) groupFor(table string, shard uint32) (*replication.Group, *shardpb.TableSpec, error) {
	spec, err := n.lookupSpec(table, false)
	if err != nil {
		return nil, nil, err
	}
	if shard >= spec.Shards {
		return nil, nil, fmt.Errorf("table %q has %d shards, not shard %d: %w", table, spec.Shards, shard, ErrUnknownShard)
	}
	g := n.Group(table, shard)
	if g == nil {
		return nil, nil, fmt.Errorf("group %s: %w: replica not open on node %s yet", groupID(table, shard), ErrUnavailable, n.cfg.ID)
	}
	return g, spec, nil
}

// levelRank orders consistency levels from weakest to strongest.
func levelRank(c shardpb.Consistency) int {
	switch c {
	case shardpb.Consistency_CONSISTENCY_EVENTUAL:
		return 1
	case shardpb.Consistency_CONSISTENCY_BOUNDED:
		return 2
	case shardpb.Consistency_CONSISTENCY_LINEARIZABLE:
		return 3
	}
	return 0
}

func (s *service) Pull(ctx context.Context, req *shardpb.PullRequest) (*shardpb.PullResponse, error) {
	g, spec, err := s.n.groupFor(req.Table, req.Shard)
	if err != nil {
		return nil, toStatus(err)
	}
	level := spec.Consistency
	if req.Consistency != shardpb.Consistency_CONSISTENCY_UNSPECIFIED {
		if levelRank(req.Consistency) < levelRank(level) {
			return nil, toStatus(fmt.Errorf("table %q is %s: %w: %s requested", req.Table, level, ErrWeakerConsistency, req.Consistency))
		}
		level = req.Consistency
	}
	keys, err := DecodeKeys(req.Keys, nil)
	if err != nil {
		return nil, toStatus(err)
	}
	if len(keys) == 0 {
		return nil, toStatus(fmt.Errorf("%w: pull of no keys", ErrBadRequest))
	}
	if need := len(keys) * int(spec.Dim) * 4; need > s.n.cfg.MaxMessageBytes {
		return nil, toStatus(fmt.Errorf("%w: %d keys of dim %d need a %d-byte answer; the limit is %d", ErrRequestTooLarge, len(keys), spec.Dim, need, s.n.cfg.MaxMessageBytes))
	}
	out := make([]float32, len(keys)*int(spec.Dim))
	if err := g.Pull(ctx, keys, out, level == shardpb.Consistency_CONSISTENCY_LINEARIZABLE); err != nil {
		return nil, toStatus(err)
	}
	return &shardpb.PullResponse{Values: ValuesBytes(out), AppliedIndex: g.AppliedIndex()}, nil
}

func (s *service) Push(ctx context.Context, req *shardpb.PushRequest) (*shardpb.PushResponse, error) {
	g, _, err := s.n.groupFor(req.Table, req.Shard)
	if err != nil {
		return nil, toStatus(err)
	}
	keys, err := DecodeKeys(req.Keys, nil)
	if err != nil {
		return nil, toStatus(err)
	}
	grads, err := DecodeValues(req.Grads, nil)
	if err != nil {
		return nil, toStatus(err)
	}
	dup, err := g.Push(ctx, &replication.Push{Client: req.ClientId, Seq: req.Seq, Keys: keys, Grads: grads})
	if err != nil {
		return nil, toStatus(err)
	}
	return &shardpb.PushResponse{Duplicate: dup}, nil
}

func (s *service) CreateTable(ctx context.Context, req *shardpb.CreateTableRequest) (*shardpb.CreateTableResponse, error) {
	if req.Spec == nil {
		return nil, toStatus(fmt.Errorf("%w: no table spec", ErrBadRequest))
	}
	spec, err := normalizeSpec(req.Spec)
	if err != nil {
		return nil, toStatus(err)
	}
	if int(spec.Replicas) != len(s.n.cfg.Peers) {
		return nil, toStatus(fmt.Errorf("%w: table %q: replicas = %d, but in this static cluster every one of the %d nodes holds every shard", store.ErrInvalidConfig, spec.Name, spec.Replicas, len(s.n.cfg.Peers)))
	}
	r := s.n.meta.Raft
	if r.State() != raft.Leader {
		addr, id := r.LeaderWithID()
		return nil, toStatus(&replication.NotLeaderError{Group: metaGroupID, LeaderID: id, LeaderAddr: addr})
	}
	cmd, err := encodeMetaCreate(spec)
	if err != nil {
		return nil, toStatus(err)
	}
	f := r.Apply(cmd, 5*time.Second)
	if err := f.Error(); err != nil {
		return nil, toStatus(fmt.Errorf("creating table %q: %w: %w", spec.Name, replication.ErrUnknownOutcome, err))
	}
	if err, ok := f.Response().(error); ok {
		return nil, toStatus(err)
	}
	// Answer once this node serves every shard, so the caller can push at once.
	if err := s.n.waitTableReady(ctx, spec); err != nil {
		return nil, toStatus(err)
	}
	return &shardpb.CreateTableResponse{Spec: spec}, nil
}

func (s *service) DescribeTable(_ context.Context, req *shardpb.DescribeTableRequest) (*shardpb.DescribeTableResponse, error) {
	spec, err := s.n.lookupSpec(req.Name, true)
	if err != nil {
		return nil, toStatus(err)
	}
	resp := &shardpb.DescribeTableResponse{Spec: spec}
	for sh := range spec.Shards {
		l := &shardpb.ShardLeader{Shard: sh}
		if g := s.n.Group(spec.Name, sh); g != nil {
			addr, id := g.Raft().LeaderWithID()
			l.LeaderAddr, l.LeaderId = string(addr), string(id)
		}
		resp.Leaders = append(resp.Leaders, l)
	}
	return resp, nil
}

func (s *service) ListTables(context.Context, *shardpb.ListTablesRequest) (*shardpb.ListTablesResponse, error) {
	if err := s.n.metaAuthoritative(); err != nil {
		addr, id := s.n.meta.Raft.LeaderWithID()
		return nil, toStatus(&replication.NotLeaderError{Group: metaGroupID, LeaderID: id, LeaderAddr: addr})
	}
	return &shardpb.ListTablesResponse{Tables: s.n.metaFSM.list()}, nil
}

func (s *service) Status(context.Context, *shardpb.StatusRequest) (*shardpb.StatusResponse, error) {
	n := s.n
	resp := &shardpb.StatusResponse{NodeId: n.cfg.ID, Addr: n.cfg.Addr}
	for _, p := range n.cfg.Peers {
		resp.Nodes = append(resp.Nodes, &shardpb.NodeInfo{Id: p.ID, Addr: p.Addr})
	}
	resp.Replicas = append(resp.Replicas, replicaStatus(metaGroupID, "", 0, n.meta.Raft, n.meta.Raft.AppliedIndex(), nil))
	for _, spec := range n.metaFSM.list() {
		for sh := range spec.Shards {
			if g := n.Group(spec.Name, sh); g != nil {
				resp.Replicas = append(resp.Replicas, replicaStatus(g.ID(), spec.Name, sh, g.Raft(), g.AppliedIndex(), g.Table()))
			}
		}
	}
	return resp, nil
}

func replicaStatus(group, table string, shard uint32, r *raft.Raft, applied uint64, t *store.Table) *shardpb.ReplicaStatus {
	addr, id := r.LeaderWithID()
	st := &shardpb.ReplicaStatus{
		Group: group, Table: table, Shard: shard,
		State:    stateName(r.State()),
		LeaderId: string(id), LeaderAddr: string(addr),
		Term: r.CurrentTerm(), AppliedIndex: applied,
		CommitIndex: r.CommitIndex(), LastIndex: r.LastIndex(),
	}
	if t != nil {
		st.Rows, st.MemoryBytes = uint64(t.Len()), uint64(t.MemoryBytes())
	}
	return st
}

func stateName(s raft.RaftState) string {
	switch s {
	case raft.Leader:
		return "leader"
	case raft.Follower:
		return "follower"
	case raft.Candidate:
		return "candidate"
	}
	return "shutdown"
}
