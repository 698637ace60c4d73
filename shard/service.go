package shard

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"time"

	"github.com/raftps/raftps/shard/api"
	"github.com/raftps/raftps/shard/membership"
	"github.com/raftps/raftps/shard/meta"

	"github.com/hashicorp/raft"
	"github.com/raftps/raftps/replication"
	"github.com/raftps/raftps/shard/shardpb"
	"github.com/raftps/raftps/store"
	"google.golang.org/protobuf/proto"
)

// service implements shardpb.ParameterServerServer. Each handler checks the
// request, calls the node or the group, and converts the error (toStatus is
// the only place errors become gRPC codes).
type service struct {
	shardpb.UnimplementedParameterServerServer
	n *Node
}

// lookupSpec returns the table's spec. Only the metadata leader, after a
// barrier, may answer that a table does not exist: a follower can miss a
// CreateTable that was committed and acknowledged a moment ago however
// recently it heard from the leader, since commits reach followers after the
// leader answers. A follower that does not know the table answers with a
// retryable error instead: for metadata requests a hint to the metadata
// leader (the client follows it), for data requests api.ErrUnavailable, unless
// the metadata leader, asked, says the table does not exist.
func (n *Node) lookupSpec(ctx context.Context, name string, metaRequest bool) (*shardpb.TableSpec, error) {
	if spec := n.metaFSM.Table(name); spec != nil {
		return spec, nil
	}
	if err := n.metaAuthoritative(); err != nil {
		if metaRequest {
			addr, id := n.meta.Raft.LeaderWithID()
			return nil, &replication.NotLeaderError{Group: api.MetaGroupID, LeaderID: id, LeaderAddr: addr}
		}
		return nil, n.askMetaLeader(ctx, name, err)
	}
	if spec := n.metaFSM.Table(name); spec != nil {
		return spec, nil
	}
	return nil, fmt.Errorf("table %q: %w", name, store.ErrUnknownTable)
}

// metaAuthoritative returns nil if this node's metadata includes every
// committed change, or why it may not. Only the leader can know: after a
// barrier it has applied everything committed before the call.
func (n *Node) metaAuthoritative() error {
	if n.meta.Raft.State() != raft.Leader {
		return fmt.Errorf("is not the metadata leader")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return n.metaReadIndex(ctx)
}

// askMetaLeader answers a data request for a table this node, a metadata
// follower, does not know (why: the reason it is not authoritative). A data
// request cannot be redirected to the metadata leader, which need not hold
// the shard's leader, so the node asks it: "unknown table" is final only on
// the leader's word; anything else is api.ErrUnavailable, which the client
// retries.
func (n *Node) askMetaLeader(ctx context.Context, name string, why error) error {
	unavailable := func(format string, args ...any) error {
		return fmt.Errorf("table %q: %w: node %s does not know it and %v, and %s", name, api.ErrUnavailable, n.cfg.ID, why, fmt.Sprintf(format, args...))
	}
	addr, _ := n.meta.Raft.LeaderWithID()
	if addr == "" || string(addr) == n.cfg.PeerAddr {
		return unavailable("no other metadata leader is known")
	}
	ps, err := n.peerStub(string(addr))
	if err != nil {
		return unavailable("cannot reach the metadata leader %s: %v", addr, err)
	}
	ctx, cancel := context.WithTimeout(ctx, metaAskTimeout)
	defer cancel()
	_, err = ps.Forward(ctx, &shardpb.ForwardRequest{From: n.cfg.ID, Call: &shardpb.ForwardRequest_DescribeTable{DescribeTable: &shardpb.DescribeTableRequest{Name: name}}})
	switch err = fromStatus(err); {
	case err == nil:
		return unavailable("the metadata leader %s has it: its creation is not applied here yet", addr)
	case errors.Is(err, api.ErrUnknownTable):
		return fmt.Errorf("table %q: %w (the metadata leader %s says so)", name, api.ErrUnknownTable, addr)
	default:
		return unavailable("the metadata leader %s did not say: %v", addr, err)
	}
}

// metaAskTimeout bounds askMetaLeader's call; the leader's own barrier in
// metaAuthoritative takes up to 2s.
const metaAskTimeout = 3 * time.Second

// groupFor finds this node's replica of table/shard and the table's spec,
// for a request carrying the client's map epoch of the shard (0: unknown).
//
// Epoch rules: an epoch older than this node's is refused (api.ErrStaleMap),
// and so is a request for a shard this node's map does not place here
// (api.ErrNotReplica), unless the client's epoch is newer than this node's (its
// map lags; the group itself is the judge then). Either way the client
// refreshes its map: no request is served by a node the map has moved the
// shard away from.
func (n *Node) groupFor(ctx context.Context, table string, shard uint32, epoch uint64) (*replication.Group, *shardpb.TableSpec, error) {
	spec, err := n.lookupSpec(ctx, table, false)
	if err != nil {
		return nil, nil, err
	}
	if err := n.checkShardEpoch(spec, shard, epoch); err != nil {
		return nil, nil, err
	}
	g := n.Group(table, shard)
	if g == nil {
		return nil, nil, fmt.Errorf("group %s: %w: replica not open on node %s yet", api.GroupID(table, shard), api.ErrUnavailable, n.cfg.ID)
	}
	return g, spec, nil
}

// checkShardEpoch applies groupFor's epoch rules to a request for shard of
// spec carrying the client's map epoch.
func (n *Node) checkShardEpoch(spec *shardpb.TableSpec, shard uint32, epoch uint64) error {
	table := spec.Name
	if shard >= spec.Shards {
		return fmt.Errorf("table %q has %d shards, not shard %d: %w", table, spec.Shards, shard, api.ErrUnknownShard)
	}
	if sm := n.metaFSM.ShardMap(table, shard); sm != nil {
		switch {
		case epoch != 0 && epoch < sm.Epoch:
			return fmt.Errorf("group %s: %w: the request has epoch %d, node %s has %d", api.GroupID(table, shard), api.ErrStaleMap, epoch, n.cfg.ID, sm.Epoch)
		case !isReplica(sm, n.cfg.ID) && epoch <= sm.Epoch:
			return fmt.Errorf("group %s: %w: node %s is not in its replica set %v at epoch %d", api.GroupID(table, shard), api.ErrNotReplica, n.cfg.ID, sm.Replicas, sm.Epoch)
		}
	}
	return nil
}

// followerFresh refuses an eventual read on a follower that has not heard
// from a leader for a while: a replica cut off from its group (partitioned,
// or removed from it without knowing) would otherwise serve old rows for
// ever. Eventual reads promise no bound, but not abandonment either.
//
// A dormant group's replicas hear from no leader at all: one serves while
// its node hears every other voter's node (a woken group's leader would
// have reached it), and otherwise wakes the group first.
func (n *Node) followerFresh(ctx context.Context, g *replication.Group) error {
	r := g.Raft()
	if r.State() == raft.Leader {
		return nil
	}
	hb := n.cfg.Raft.HeartbeatTimeout
	if hb == 0 {
		hb = replication.DefaultRaftConfig().HeartbeatTimeout
	}
	limit := max(10*hb, 2*time.Second)
	if g.Dormant() {
		if g.DormantFresh(limit) {
			return nil
		}
		g.Awaken(ctx)
		if r.State() == raft.Leader {
			return nil
		}
	}
	if last := r.LastContact(); last.IsZero() || time.Since(last) > limit {
		return fmt.Errorf("group %s: %w: replica on node %s has not heard from a leader for over %s", g.ID(), api.ErrUnavailable, n.cfg.ID, limit)
	}
	return nil
}

// checkSize refuses a request larger than MaxMessageBytes. The gRPC server
// itself admits messages up to the larger Raft limit (see StartNode), so the
// client API enforces its own limit here, before any work.
func (s *service) checkSize(what string, req proto.Message) error {
	if size := proto.Size(req); size > s.n.cfg.MaxMessageBytes {
		return fmt.Errorf("%w: %s request of %d bytes is larger than max message size %d", api.ErrRequestTooLarge, what, size, s.n.cfg.MaxMessageBytes)
	}
	return nil
}

// Pull serves a pull at the table's level or the stronger one asked:
// linearizable by the leader after a read-index check; bounded by any
// replica holding a read lease within the bound (else api.ErrTooStale: the
// client asks another), or by a read replica of the keys if they are hot;
// eventual by any replica that has heard from a leader lately, or a read
// replica.
func (s *service) Pull(ctx context.Context, req *shardpb.PullRequest) (*shardpb.PullResponse, error) {
	if err := s.checkSize("pull", req); err != nil {
		return nil, s.n.toStatus(err)
	}
	spec, err := s.n.lookupSpec(ctx, req.Table, false)
	if err != nil {
		return nil, s.n.toStatus(err)
	}
	level := spec.Consistency
	if req.Consistency != shardpb.Consistency_CONSISTENCY_UNSPECIFIED {
		if api.LevelRank(req.Consistency) == 0 {
			return nil, s.n.toStatus(fmt.Errorf("%w: consistency %s", api.ErrBadRequest, req.Consistency))
		}
		if api.LevelRank(req.Consistency) < api.LevelRank(level) && !req.AllowWeaker {
			return nil, s.n.toStatus(fmt.Errorf("table %q is %s: %w: %s requested (set allow_weaker to ask for it)", req.Table, api.LevelName(level), api.ErrWeakerConsistency, api.LevelName(req.Consistency)))
		}
		level = req.Consistency
	}
	bound := time.Duration(spec.StalenessBoundNs)
	if level == shardpb.Consistency_CONSISTENCY_BOUNDED && req.StalenessBoundNs > 0 {
		// A request may tighten the table's bound, or set one for a
		// stronger table's bounded read; never loosen it silently.
		if bound == 0 || time.Duration(req.StalenessBoundNs) < bound || req.AllowWeaker {
			bound = time.Duration(req.StalenessBoundNs)
		}
	}
	if level == shardpb.Consistency_CONSISTENCY_BOUNDED && bound <= 0 {
		return nil, s.n.toStatus(fmt.Errorf("%w: a bounded read of %s table %q needs staleness_bound_ns", api.ErrBadRequest, api.LevelName(spec.Consistency), req.Table))
	}
	keys, err := api.DecodeKeys(req.Keys, nil)
	if err != nil {
		return nil, s.n.toStatus(err)
	}
	if len(keys) == 0 {
		return nil, s.n.toStatus(fmt.Errorf("%w: pull of no keys", api.ErrBadRequest))
	}
	if err := s.n.answerBudgetOf(ctx).take(len(keys), int(spec.Dim)); err != nil {
		return nil, s.n.toStatus(err)
	}
	if req.Shard < spec.Shards && s.n.Group(req.Table, req.Shard) == nil && s.n.Chain(req.Table, req.Shard) == nil {
		if out, ok, err := s.n.serveHot(spec, req.Shard, keys, level, bound); ok {
			if err != nil {
				s.n.served.refused(roleReadReplica, level)
				return nil, s.n.toStatus(err)
			}
			s.n.served.served(roleReadReplica, level, len(keys))
			s.n.countHot(spec, req.Shard, keys)
			return &shardpb.PullResponse{Values: api.ValuesBytes(out), ServedBy: roleNames[roleReadReplica]}, nil
		}
	}
	if api.IsChain(spec) {
		return s.chainPull(ctx, spec, req, keys, level, bound)
	}
	g, _, err := s.n.groupFor(ctx, req.Table, req.Shard, req.Epoch)
	if err != nil {
		return nil, s.n.toStatus(err)
	}
	role := roleFollower
	if g.IsLeader() {
		role = roleLeader
	}
	switch level {
	case shardpb.Consistency_CONSISTENCY_BOUNDED:
		err = s.n.boundedFresh(ctx, g, req.Table, req.Shard, bound)
	case shardpb.Consistency_CONSISTENCY_EVENTUAL:
		err = s.n.followerFresh(ctx, g)
	}
	if err != nil {
		s.n.served.refused(role, level)
		return nil, s.n.toStatus(err)
	}
	// From the pool answerCodec returns it to once it is written; Lookup
	// writes every value.
	values := pullValues(len(keys) * int(spec.Dim) * 4)
	checked := level == shardpb.Consistency_CONSISTENCY_LINEARIZABLE && testBreak != breakFollowerLinearizable
	if err := g.Pull(ctx, keys, api.FloatsOf(values), checked); err != nil {
		return nil, s.n.toStatus(err)
	}
	s.n.served.served(role, level, len(keys))
	s.n.countHot(spec, req.Shard, keys)
	return &shardpb.PullResponse{Values: values, AppliedIndex: g.AppliedIndex(), ServedBy: roleNames[role]}, nil
}

func (s *service) Push(ctx context.Context, req *shardpb.PushRequest) (*shardpb.PushResponse, error) {
	if err := s.checkSize("push", req); err != nil {
		return nil, s.n.toStatus(err)
	}
	spec, err := s.n.lookupSpec(ctx, req.Table, false)
	if err != nil {
		return nil, s.n.toStatus(err)
	}
	var g *replication.Group
	if !api.IsChain(spec) {
		if g, _, err = s.n.groupFor(ctx, req.Table, req.Shard, req.Epoch); err != nil {
			return nil, s.n.toStatus(err)
		}
	}
	keys, err := api.DecodeKeys(req.Keys, nil)
	if err != nil {
		return nil, s.n.toStatus(err)
	}
	bf16 := api.IsBF16(spec)
	grads, err := api.DecodeGrads(req.Grads, req.GradsBf16, bf16)
	if err != nil {
		return nil, s.n.toStatus(err)
	}
	if testBreak == breakDropAckedPush && s.n.pushes.Add(1)%50 == 0 {
		return &shardpb.PushResponse{}, nil
	}
	if g == nil {
		return s.chainPush(ctx, spec, req, keys, grads)
	}
	// Only the leader writes a push to its log: a follower's answer
	// (NotLeader) sends the client to it.
	if g.IsLeader() {
		if err := s.n.disk.Check(); err != nil {
			return nil, s.n.toStatus(err)
		}
	}
	dup, err := g.Push(ctx, &replication.Push{Client: req.ClientId, Seq: req.Seq, Keys: keys, Grads: grads, BF16: bf16})
	if err != nil {
		return nil, s.n.toStatus(err)
	}
	return &shardpb.PushResponse{Duplicate: dup}, nil
}

// PullBatch serves each part as Pull would. Parts run concurrently (up to
// BatchWorkers at once), so the leadership checks of linearizable parts of
// different groups overlap. The parts' answers share one MaxAnswerBytes.
func (s *service) PullBatch(ctx context.Context, req *shardpb.PullBatchRequest) (*shardpb.PullBatchResponse, error) {
	if err := s.checkSize("pull batch", req); err != nil {
		return nil, s.n.toStatus(err)
	}
	if err := s.n.checkParts("pull batch", len(req.Parts)); err != nil {
		return nil, s.n.toStatus(err)
	}
	keys := func(i int) (string, int) { return req.Parts[i].Table, len(req.Parts[i].Keys) / 8 }
	if err := s.n.checkBatchAnswer(keys, len(req.Parts)); err != nil {
		return nil, s.n.toStatus(err)
	}
	ctx = context.WithValue(ctx, answerBudgetKey{}, newAnswerBudget(s.n.cfg.MaxAnswerBytes))
	parts, errs := serveParts(ctx, req.Parts, s.n.cfg.BatchWorkers, s.Pull)
	return &shardpb.PullBatchResponse{Parts: parts, Errors: errs}, nil
}

// PushBatch serves each part as Push would, concurrently (up to
// BatchWorkers at once): parts of different shards go to different groups'
// batchers and logs.
func (s *service) PushBatch(ctx context.Context, req *shardpb.PushBatchRequest) (*shardpb.PushBatchResponse, error) {
	if err := s.checkSize("push batch", req); err != nil {
		return nil, s.n.toStatus(err)
	}
	if err := s.n.checkParts("push batch", len(req.Parts)); err != nil {
		return nil, s.n.toStatus(err)
	}
	parts, errs := serveParts(ctx, req.Parts, s.n.cfg.BatchWorkers, s.Push)
	return &shardpb.PushBatchResponse{Parts: parts, Errors: errs}, nil
}

// serveParts runs serve on every part, workers at a time. A failed part
// gets an empty response and its status in errs (a repeated message field
// may hold no nil); a part that succeeded gets a zero PartError.
func serveParts[Req any, Resp any, PResp interface {
	*Resp
	proto.Message
}](ctx context.Context, parts []Req, workers int, serve func(context.Context, Req) (PResp, error)) ([]PResp, []*shardpb.PartError) {
	resps := make([]PResp, len(parts))
	errs := make([]*shardpb.PartError, len(parts))
	replication.ServeBounded(len(parts), workers, func(i int) {
		r, err := serve(ctx, parts[i])
		if r == nil {
			r = PResp(new(Resp))
		}
		resps[i], errs[i] = r, api.ToPartError(err)
	})
	return resps, errs
}

func (s *service) CreateTable(ctx context.Context, req *shardpb.CreateTableRequest) (*shardpb.CreateTableResponse, error) {
	if err := s.checkSize("create-table", req); err != nil {
		return nil, s.n.toStatus(err)
	}
	if req.Spec == nil {
		return nil, s.n.toStatus(fmt.Errorf("%w: no table spec", api.ErrBadRequest))
	}
	spec, err := api.NormalizeSpec(req.Spec)
	if err != nil {
		return nil, s.n.toStatus(err)
	}
	r := s.n.meta.Raft
	if r.State() != raft.Leader {
		addr, id := r.LeaderWithID()
		return nil, s.n.toStatus(&replication.NotLeaderError{Group: api.MetaGroupID, LeaderID: id, LeaderAddr: addr})
	}
	s.n.waitPeersRegistered(ctx)
	if api.IsBF16(spec) {
		if err := s.n.waitEveryNodeHas(ctx, api.FeatureBF16Grads, fmt.Sprintf("table %q: bf16 gradients", spec.Name)); err != nil {
			return nil, s.n.toStatus(err)
		}
	}
	cmd, err := s.n.initialPlacement(spec)
	if err != nil {
		return nil, s.n.toStatus(err)
	}
	if _, err := s.n.applyMeta(meta.CmdCreateTableV2, cmd, fmt.Sprintf("creating table %q", spec.Name)); err != nil {
		return nil, s.n.toStatus(err)
	}
	// Answer once this node serves every shard, so the caller can push at once.
	ready := s.n.waitTableReady
	if api.IsChain(spec) {
		ready = s.n.waitChainReady
	}
	if err := ready(ctx, spec); err != nil {
		return nil, s.n.toStatus(err)
	}
	return &shardpb.CreateTableResponse{Spec: spec}, nil
}

func (s *service) DescribeTable(ctx context.Context, req *shardpb.DescribeTableRequest) (*shardpb.DescribeTableResponse, error) {
	resp, err := s.describe(ctx, req)
	return resp, s.n.toStatus(err)
}

// describe is DescribeTable's answer: the spec, and each shard's placement
// and leader (its node ID and client address) as this node knows them.
func (s *service) describe(ctx context.Context, req *shardpb.DescribeTableRequest) (*shardpb.DescribeTableResponse, error) {
	spec, err := s.n.lookupSpec(ctx, req.Name, true)
	if err != nil {
		return nil, err
	}
	resp := &shardpb.DescribeTableResponse{Spec: spec}
	resp.Shards, resp.Nodes = s.n.metaFSM.TableShards(spec)
	for sh := range spec.Shards {
		l := &shardpb.ShardLeader{Shard: sh}
		if g := s.n.Group(spec.Name, sh); g != nil {
			addr, id := g.LeaderHint()
			l.LeaderId = string(id)
			l.LeaderAddr = s.n.clientAddrOf(l.LeaderId, string(addr))
		}
		if sm := resp.Shards[sh]; api.IsChain(spec) && sm != nil && len(sm.Replicas) > 0 {
			// A chain's head is the map's first replica.
			l.LeaderId = sm.Replicas[0]
			for _, nd := range resp.Nodes {
				if nd.Id == l.LeaderId {
					l.LeaderAddr = nd.Addr
				}
			}
		}
		resp.Leaders = append(resp.Leaders, l)
		if resp.Shards[sh] == nil {
			// A table created before the cluster map: no placement.
			resp.Shards[sh] = &shardpb.ShardMap{Table: spec.Name, Shard: sh}
		}
	}
	return resp, nil
}

func (s *service) ListTables(context.Context, *shardpb.ListTablesRequest) (*shardpb.ListTablesResponse, error) {
	if err := s.n.metaAuthoritative(); err != nil {
		addr, id := s.n.meta.Raft.LeaderWithID()
		return nil, s.n.toStatus(&replication.NotLeaderError{Group: api.MetaGroupID, LeaderID: id, LeaderAddr: addr})
	}
	return &shardpb.ListTablesResponse{Tables: s.n.metaFSM.List()}, nil
}

// applyMeta commits a metadata command through this node, which must be the
// metadata leader, and returns what meta.FSM.Apply answered (what: the
// operation, for errors). A failure to commit is ErrUnknownOutcome: the
// entry may still commit, so a caller's retry must allow for it having been
// applied (CreateTable's finds its table, JoinJob's its rank).
func (n *Node) applyMeta(cmd byte, arg proto.Message, what string) (any, error) {
	out, _, err := n.applyMetaAt(cmd, arg, what)
	return out, err
}

// applyMetaAt is applyMeta that also returns the entry's log index.
func (n *Node) applyMetaAt(cmd byte, arg proto.Message, what string) (any, uint64, error) {
	b, err := meta.Encode(cmd, arg)
	if err != nil {
		return nil, 0, fmt.Errorf("%s: %w", what, err)
	}
	f := n.meta.Raft.Apply(b, 5*time.Second)
	if err := f.Error(); err != nil {
		return nil, 0, fmt.Errorf("%s: %w: %w", what, replication.ErrUnknownOutcome, err)
	}
	if err, ok := f.Response().(error); ok {
		return nil, 0, err
	}
	return f.Response(), f.Index(), nil
}

func (s *service) JoinJob(ctx context.Context, req *shardpb.JoinJobRequest) (*shardpb.JoinJobResponse, error) {
	if err := meta.CheckJoinRequest(req); err != nil {
		return nil, s.n.toStatus(err)
	}
	return onMetaLeader(ctx, s.n, func() (*shardpb.JoinJobResponse, error) { return s.n.joinJob(req) },
		&shardpb.ForwardRequest{Call: &shardpb.ForwardRequest_JoinJob{JoinJob: req}}, (*shardpb.ForwardResponse).GetJoinJob)
}

// GetJob answers on the metadata leader's word only, after a barrier, so
// that a trainer that just joined sees its own join: a follower may not have
// applied it yet.
func (s *service) GetJob(ctx context.Context, req *shardpb.GetJobRequest) (*shardpb.GetJobResponse, error) {
	if err := api.CheckJobName(req.Job); err != nil {
		return nil, s.n.toStatus(err)
	}
	return onMetaLeader(ctx, s.n, func() (*shardpb.GetJobResponse, error) { return s.n.getJob(req) },
		&shardpb.ForwardRequest{Call: &shardpb.ForwardRequest_GetJob{GetJob: req}}, (*shardpb.ForwardResponse).GetGetJob)
}

func (s *service) DeleteJob(ctx context.Context, req *shardpb.DeleteJobRequest) (*shardpb.DeleteJobResponse, error) {
	if err := api.CheckJobName(req.Job); err != nil {
		return nil, s.n.toStatus(err)
	}
	return onMetaLeader(ctx, s.n, func() (*shardpb.DeleteJobResponse, error) { return s.n.deleteJob(req) },
		&shardpb.ForwardRequest{Call: &shardpb.ForwardRequest_DeleteJob{DeleteJob: req}}, (*shardpb.ForwardResponse).GetDeleteJob)
}

func (s *service) ReportEval(ctx context.Context, req *shardpb.ReportEvalRequest) (*shardpb.ReportEvalResponse, error) {
	if err := meta.CheckReportEval(req); err != nil {
		return nil, s.n.toStatus(err)
	}
	return onMetaLeader(ctx, s.n, func() (*shardpb.ReportEvalResponse, error) { return s.n.reportEval(req) },
		&shardpb.ForwardRequest{Call: &shardpb.ForwardRequest_ReportEval{ReportEval: req}}, (*shardpb.ForwardResponse).GetReportEval)
}

func (n *Node) reportEval(req *shardpb.ReportEvalRequest) (*shardpb.ReportEvalResponse, error) {
	if _, err := n.applyMeta(meta.CmdReportEval, req, fmt.Sprintf("recording an evaluation of job %q", req.Job)); err != nil {
		return nil, err
	}
	return &shardpb.ReportEvalResponse{}, nil
}

func (n *Node) joinJob(req *shardpb.JoinJobRequest) (*shardpb.JoinJobResponse, error) {
	if err := meta.CheckJobTables(req.Job, req.Tables); err != nil {
		return nil, err
	}
	out, err := n.applyMeta(meta.CmdJoinJobV2, &shardpb.MetaJoinJob{Join: req, MaxJobs: uint32(min(n.cfg.MaxJobs, math.MaxUint32))}, fmt.Sprintf("joining job %q", req.Job))
	if err != nil {
		return nil, err
	}
	resp, ok := out.(*shardpb.JoinJobResponse)
	if !ok {
		return nil, fmt.Errorf("joining job %q: the metadata group answered %T", req.Job, out)
	}
	return resp, nil
}

func (n *Node) getJob(req *shardpb.GetJobRequest) (*shardpb.GetJobResponse, error) {
	if err := n.metaAuthoritative(); err != nil {
		return nil, fmt.Errorf("job %q: %w: node %s %v", req.Job, api.ErrUnavailable, n.cfg.ID, err)
	}
	j := n.metaFSM.Job(req.Job)
	if j == nil {
		return nil, fmt.Errorf("job %q: %w", req.Job, api.ErrUnknownJob)
	}
	return &shardpb.GetJobResponse{Job: j, Complete: meta.JobComplete(j)}, nil
}

func (n *Node) deleteJob(req *shardpb.DeleteJobRequest) (*shardpb.DeleteJobResponse, error) {
	if _, err := n.applyMeta(meta.CmdDeleteJob, req, fmt.Sprintf("deleting job %q", req.Job)); err != nil {
		return nil, err
	}
	return &shardpb.DeleteJobResponse{}, nil
}

// Status answers this node's view of the cluster. Checksums come from the
// node's rate-limited checksum passes (checksums.go).
func (s *service) Status(ctx context.Context, req *shardpb.StatusRequest) (*shardpb.StatusResponse, error) {
	n := s.n
	var sums map[string]replicaSum
	if req.GetChecksums() {
		sums = n.checksums(ctx)
	}
	cm := n.metaFSM.ClusterMap()
	resp := &shardpb.StatusResponse{NodeId: n.cfg.ID, Addr: n.cfg.Addr, Jobs: n.metaFSM.JobList(), MapVersion: cm.Version,
		Hot: n.hotShards(""), Served: n.served.snapshot(), Load: n.metrics.Load(n.cfg.DataDir),
		SetAside: n.setAside.status(), Disk: n.diskStatus(), MetaProcessed: n.metaFSM.Processed()}
	resp.Replicas = append(resp.Replicas, n.replicaStatus(api.MetaGroupID, "", 0, n.meta.Raft, n.meta.Raft.AppliedIndex(), nil))
	members := n.memberMap()
	live := func(id string) bool {
		st := members[id].State
		return st == membership.Alive || st == membership.Suspect
	}
	specs := map[string]*shardpb.TableSpec{}
	for _, t := range cm.Tables {
		specs[t.Name] = t
	}
	replicas := map[string]uint32{}
	for _, sm := range cm.Shards {
		spec := specs[sm.Table]
		if spec == nil {
			continue
		}
		liveReplicas := 0
		for _, id := range sm.Replicas {
			replicas[id]++
			if live(id) {
				liveReplicas++
			}
		}
		if liveReplicas < int(spec.Replicas) {
			resp.UnderReplicated++
		}
		if sm.Adding != "" {
			resp.Moving = append(resp.Moving, sm)
		}
		if ch := n.Chain(sm.Table, sm.Shard); ch != nil {
			rs := chainStatus(ch, sm.Table, sm.Shard, cm)
			withSum(rs, sums)
			resp.Replicas = append(resp.Replicas, rs)
		}
		if g := n.Group(sm.Table, sm.Shard); g != nil {
			rs := n.replicaStatus(g.ID(), sm.Table, sm.Shard, g.Raft(), g.AppliedIndex(), g.Table())
			rs.Quiet, rs.Dormant = g.Quiet(), g.Dormant()
			withSum(rs, sums)
			resp.Replicas = append(resp.Replicas, rs)
		}
	}
	// Every node in the map, and any other the gossip knows (a node not
	// registered yet), sorted by ID.
	ids := map[string]bool{}
	for _, nd := range cm.Nodes {
		ids[nd.Id] = true
	}
	for id := range members {
		ids[id] = true
	}
	for _, id := range slices.Sorted(maps.Keys(ids)) {
		m, ok := members[id]
		info := &shardpb.NodeInfo{Id: id, Addr: m.Addr, State: membership.Dead, Replicas: replicas[id], Admin: "unregistered"}
		if ok {
			info.State = m.State
			if m.State != membership.Dead {
				info.Leaders = m.Leaders
			}
		}
		if nd := n.metaFSM.Node(id); nd != nil {
			info.Addr, info.Admin = nd.Addr, meta.AdminName(nd.Admin)
		}
		if id == n.cfg.ID {
			info.Leaders = n.leaderCount()
		}
		resp.Nodes = append(resp.Nodes, info)
	}
	return resp, nil
}

// withSum sets rs's checksum from sums if it belongs to the applied index
// rs reports.
func withSum(rs *shardpb.ReplicaStatus, sums map[string]replicaSum) {
	if s, ok := sums[api.GroupID(rs.Table, rs.Shard)]; ok && s.applied == rs.AppliedIndex {
		rs.Checksum, rs.HasChecksum = s.sum, true
	}
}

// replicaStatus is a Raft replica's status line; it names the leader by
// its node ID and client address.
func (n *Node) replicaStatus(group, table string, shard uint32, r *raft.Raft, applied uint64, t *store.Table) *shardpb.ReplicaStatus {
	addr, id := r.LeaderWithID()
	st := &shardpb.ReplicaStatus{
		Group: group, Table: table, Shard: shard,
		State:    stateName(r.State()),
		LeaderId: string(id), LeaderAddr: n.clientAddrOf(string(id), string(addr)),
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
