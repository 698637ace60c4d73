package shard

import (
	"context"
	"fmt"

	"github.com/hashicorp/raft"
	"github.com/raftps/raftps/replication"
	"github.com/raftps/raftps/shard/api"
	"github.com/raftps/raftps/shard/meta"
	"github.com/raftps/raftps/shard/shardpb"
	"google.golang.org/grpc/status"
)

// peerService implements shardpb.PeerServer, the calls between the nodes
// of the cluster, on the peer listener. Its handlers live beside the
// features they serve (hot.go, consistency.go, chainconfirm.go, ...); this
// file has the service's own: Status between nodes, and Forward.
type peerService struct {
	shardpb.UnimplementedPeerServer
	n *Node
}

// Status is the client API's Status, for another node.
func (s *peerService) Status(ctx context.Context, req *shardpb.StatusRequest) (*shardpb.StatusResponse, error) {
	return (&service{n: s.n}).Status(ctx, req)
}

// Forward serves a client call a metadata follower forwarded: here if this
// node leads the metadata group, else refused with the leader it knows,
// never forwarded again (one hop at most, however leadership moves).
func (s *peerService) Forward(ctx context.Context, req *shardpb.ForwardRequest) (*shardpb.ForwardResponse, error) {
	n := s.n
	if n.meta.Raft.State() != raft.Leader {
		return nil, n.toStatus(n.notMetaLeader())
	}
	var out shardpb.ForwardResponse
	var err error
	switch c := req.Call.(type) {
	case *shardpb.ForwardRequest_AlterTable:
		var r *shardpb.AlterTableResponse
		r, err = n.alterTable(c.AlterTable)
		out.Result = &shardpb.ForwardResponse_AlterTable{AlterTable: r}
	case *shardpb.ForwardRequest_SetNodeAdmin:
		err = n.setNodeAdmin(c.SetNodeAdmin)
		out.Result = &shardpb.ForwardResponse_SetNodeAdmin{SetNodeAdmin: &shardpb.SetNodeAdminResponse{}}
	case *shardpb.ForwardRequest_GetClusterMap:
		var r *shardpb.ClusterMap
		r, err = n.authoritativeMap()
		out.Result = &shardpb.ForwardResponse_ClusterMap{ClusterMap: r}
	case *shardpb.ForwardRequest_JoinJob:
		if err = meta.CheckJoinRequest(c.JoinJob); err == nil {
			var r *shardpb.JoinJobResponse
			r, err = n.joinJob(c.JoinJob)
			out.Result = &shardpb.ForwardResponse_JoinJob{JoinJob: r}
		}
	case *shardpb.ForwardRequest_ReportEval:
		if err = meta.CheckReportEval(c.ReportEval); err == nil {
			var r *shardpb.ReportEvalResponse
			r, err = n.reportEval(c.ReportEval)
			out.Result = &shardpb.ForwardResponse_ReportEval{ReportEval: r}
		}
	case *shardpb.ForwardRequest_GetJob:
		var r *shardpb.GetJobResponse
		r, err = n.getJob(c.GetJob)
		out.Result = &shardpb.ForwardResponse_GetJob{GetJob: r}
	case *shardpb.ForwardRequest_DeleteJob:
		var r *shardpb.DeleteJobResponse
		r, err = n.deleteJob(c.DeleteJob)
		out.Result = &shardpb.ForwardResponse_DeleteJob{DeleteJob: r}
	case *shardpb.ForwardRequest_DropTable:
		var r *shardpb.DropTableResponse
		r, err = n.dropTable(c.DropTable)
		out.Result = &shardpb.ForwardResponse_DropTable{DropTable: r}
	case *shardpb.ForwardRequest_DescribeTable:
		var r *shardpb.DescribeTableResponse
		r, err = (&service{n: n}).describe(ctx, c.DescribeTable)
		out.Result = &shardpb.ForwardResponse_DescribeTable{DescribeTable: r}
	case *shardpb.ForwardRequest_PutToken:
		var r *shardpb.CreateTokenResponse
		r, err = n.putToken(ctx, c.PutToken)
		out.Result = &shardpb.ForwardResponse_PutToken{PutToken: r}
	case *shardpb.ForwardRequest_DeleteToken:
		var r *shardpb.DeleteTokenResponse
		r, err = n.deleteToken(ctx, c.DeleteToken)
		out.Result = &shardpb.ForwardResponse_DeleteToken{DeleteToken: r}
	case *shardpb.ForwardRequest_ListTokens:
		var r *shardpb.ListTokensResponse
		r, err = n.listTokens()
		out.Result = &shardpb.ForwardResponse_ListTokens{ListTokens: r}
	default:
		err = fmt.Errorf("%w: node %s forwarded a call of no kind this node knows (%T)", api.ErrBadRequest, req.From, req.Call)
	}
	if err != nil {
		return nil, n.toStatus(err)
	}
	return &out, nil
}

// onMetaLeader serves a client call that only the metadata leader may: with
// local if this node leads, else by forwarding it (fwd) to the leader over
// the peer API, whose answer (pick takes it out of the forward's), error
// status included, is passed back. Trainers, unlike CreateTable's callers,
// may be given one node's address only, and a follower's redirect could
// point where they cannot go; a forward costs one hop between nodes that
// talk anyway.
func onMetaLeader[Resp any](ctx context.Context, n *Node, local func() (*Resp, error),
	fwd *shardpb.ForwardRequest, pick func(*shardpb.ForwardResponse) *Resp) (*Resp, error) {
	r := n.meta.Raft
	if r.State() == raft.Leader {
		resp, err := local()
		if err != nil {
			return nil, n.toStatus(err)
		}
		return resp, nil
	}
	addr, _ := r.LeaderWithID()
	if addr == "" || string(addr) == n.cfg.PeerAddr {
		return nil, n.toStatus(n.notMetaLeader())
	}
	ps, err := n.peerStub(string(addr))
	if err != nil {
		// The client may reach the leader where this node cannot.
		return nil, n.toStatus(n.notMetaLeader())
	}
	fwd.From = n.cfg.ID
	out, err := ps.Forward(ctx, fwd)
	if err != nil {
		st := status.Convert(err).Proto()
		st.Message = fmt.Sprintf("node %s forwarded to the metadata leader %s: %s", n.cfg.ID, addr, st.Message)
		return nil, status.ErrorProto(st)
	}
	resp := pick(out)
	if resp == nil {
		return nil, n.toStatus(fmt.Errorf("%w: the metadata leader %s answered a forward with %T", api.ErrUnavailable, addr, out.Result))
	}
	return resp, nil
}

// notMetaLeader is the answer to a request only the metadata leader takes:
// the leader this node knows, if another.
func (n *Node) notMetaLeader() error {
	addr, id := n.meta.Raft.LeaderWithID()
	if string(addr) == n.cfg.PeerAddr {
		addr, id = "", ""
	}
	return &replication.NotLeaderError{Group: api.MetaGroupID, LeaderID: id, LeaderAddr: addr}
}
