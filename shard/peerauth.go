package shard

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"

	"github.com/hashicorp/raft"
	"github.com/raftps/raftps/shard/api"
	"github.com/raftps/raftps/shard/auth"
	"github.com/raftps/raftps/shard/shardpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
)

// checkPeerCall is the peer API's check of what a node may ask of this
// one, after the peer gate has proved which node calls: an interceptor, so
// that the handlers stay as they are and this node's own calls of them
// (callReconfigure to itself) are not checked. Raft's and chain's messages
// are checked by their transports' hooks (security.go).
func (n *Node) checkPeerCall(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if strings.HasPrefix(info.FullMethod, peerServicePrefix) {
		if err := n.peerCallAllowed(ctx, req); err != nil {
			return nil, err
		}
	}
	return handler(ctx, req)
}

// peerServicePrefix begins the full method names of the Peer service's
// calls (the Raft and chain services on the same listener are not its).
var peerServicePrefix = "/" + shardpb.Peer_ServiceDesc.ServiceName + "/"

// peerCallAllowed is checkPeerCall's decision for one request.
func (n *Node) peerCallAllowed(ctx context.Context, req any) error {
	inMap := func(what string) error {
		_, err := auth.RequireMember(ctx, what, n.inClusterMap)
		return err
	}
	switch r := req.(type) {
	case *shardpb.JoinClusterRequest:
		return n.joinAllowed(ctx, r)
	case *shardpb.ForwardRequest:
		if err := auth.RequireNode(ctx, r.From); err != nil {
			return err
		}
		return inMap("the cluster map")
	case *shardpb.StatusRequest, *shardpb.ConfirmChainsRequest, *shardpb.HotRowsRequest:
		return inMap("the cluster map")
	case *shardpb.ReconfigureRequest:
		if r.Op == shardpb.ReconfigureOp_RECONFIGURE_QUERY {
			return inMap("the cluster map")
		}
		return n.fromMetaLeader(ctx, r)
	case *shardpb.ReadIndexRequest:
		return n.fromReplica(ctx, r.Table, r.Shard, nil)
	case *shardpb.ReportHotRequest:
		// Hot-key read replicas report too, and need not be replicas.
		if err := auth.RequireNode(ctx, r.NodeId); err != nil {
			return err
		}
		return inMap("the cluster map")
	case *shardpb.AssignHotRequest:
		// Only the shard's leader assigns its hot keys, naming itself as
		// where the rows are read.
		return n.fromReplica(ctx, r.Table, r.Shard, func(caller string) bool { return n.peerAddrOf(caller) == r.LeaderAddr })
	case *shardpb.ReportBrokenRequest:
		if err := auth.RequireNode(ctx, r.NodeId); err != nil {
			return err
		}
		_, err := auth.RequireMember(ctx, "chain "+r.Group, func(caller string) bool { return n.inChain(r.Group, caller) })
		return err
	}
	// A method this check does not know is refused: a new peer call must
	// say who may make it.
	_, err := auth.RequireMember(ctx, fmt.Sprintf("the nodes that may send a %T", req), func(string) bool { return false })
	return err
}

// inClusterMap reports whether node id is in the cluster map, the static
// peer list or the metadata group's configuration.
func (n *Node) inClusterMap(id string) bool {
	if n.metaFSM.Node(id) != nil || slices.ContainsFunc(n.cfg.Peers, func(p Peer) bool { return p.ID == id }) {
		return true
	}
	return slices.ContainsFunc(n.meta.Raft.GetConfiguration().Configuration().Servers, func(s raft.Server) bool { return string(s.ID) == id })
}

// fromReplica checks that the caller is a replica of the shard (map
// placement or the group's configuration here) and, if also is set, that
// also holds for it.
func (n *Node) fromReplica(ctx context.Context, table string, shard uint32, also func(string) bool) error {
	group := api.GroupID(table, shard)
	what := "shard " + group
	if also != nil {
		what = "shard " + group + " as its leader"
	}
	_, err := auth.RequireMember(ctx, what, func(caller string) bool {
		if also != nil && !also(caller) {
			return false
		}
		return n.inRaftGroup(group, caller, n.peerAddrOf(caller)) || n.inChain(group, caller)
	})
	return err
}

// fromMetaLeader checks that a change of a group's membership comes from
// the metadata leader as this node knows it. A voter of the metadata group
// that is not may have just been elected: its call is refused as
// retryable.
func (n *Node) fromMetaLeader(ctx context.Context, r *shardpb.ReconfigureRequest) error {
	caller, ok := auth.NodeID(ctx)
	if !ok {
		_, err := auth.RequireMember(ctx, "the metadata group's leadership", func(string) bool { return false })
		return err
	}
	if _, leader := n.meta.Raft.LeaderWithID(); string(leader) == caller {
		return nil
	}
	for _, s := range n.meta.Raft.GetConfiguration().Configuration().Servers {
		if string(s.ID) == caller && s.Suffrage == raft.Voter {
			return n.toStatus(fmt.Errorf("%w: node %s asked to change group %s but is not the metadata leader node %s knows", api.ErrUnavailable, caller, api.GroupID(r.Table, r.Shard), n.cfg.ID))
		}
	}
	_, err := auth.RequireMember(ctx, "the metadata group's voters", func(string) bool { return false })
	return err
}

// joinAllowed checks a JoinCluster: a node registers itself only, at a
// peer address its certificate names the host of. A metadata follower
// forwards the call as it is, with its own ID in the metadata: then the
// caller is that follower, which made these checks, and must be in the
// map.
func (n *Node) joinAllowed(ctx context.Context, r *shardpb.JoinClusterRequest) error {
	if md, _ := metadata.FromIncomingContext(ctx); len(md.Get(forwardedFromKey)) > 0 {
		if err := auth.RequireNode(ctx, md.Get(forwardedFromKey)[0]); err != nil {
			return err
		}
		_, err := auth.RequireMember(ctx, "the cluster map", n.inClusterMap)
		return err
	}
	if err := auth.RequireNode(ctx, r.Node.GetId()); err != nil {
		return err
	}
	host, _, err := net.SplitHostPort(r.Node.GetPeerAddr())
	if err != nil {
		return n.toStatus(fmt.Errorf("%w: joining node's peer address %q: %v", api.ErrBadRequest, r.Node.GetPeerAddr(), err))
	}
	_, err = auth.RequireMember(ctx, "the nodes whose certificate names host "+host, func(string) bool {
		p, ok := peer.FromContext(ctx)
		if !ok {
			return false
		}
		ti, ok := p.AuthInfo.(credentials.TLSInfo)
		if !ok || len(ti.State.VerifiedChains) == 0 {
			return false
		}
		return ti.State.VerifiedChains[0][0].VerifyHostname(host) == nil
	})
	return err
}
