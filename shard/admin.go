package shard

import (
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/raftps/raftps/shard/api"
	"github.com/raftps/raftps/shard/membership"
	"github.com/raftps/raftps/shard/meta"
	"github.com/raftps/raftps/shard/placement"
	"google.golang.org/grpc/metadata"

	"github.com/hashicorp/raft"
	"github.com/raftps/raftps/shard/shardpb"
	"github.com/raftps/raftps/store"
)

// The cluster administration calls: joining, draining and removing nodes,
// reading the map, and a new table's first placement. All of them run on the
// metadata leader (a follower forwards them: onMetaLeader).

// forwardedFromKey is the gRPC metadata key a node sets (to its ID) on a
// JoinCluster it forwards to the metadata leader. A node receiving such a
// call that is not the leader (any more) refuses it with a NotLeader hint
// instead of forwarding it again: one hop at most.
const forwardedFromKey = "raftps-forwarded-from"

// JoinCluster registers a node, on the metadata leader; a follower
// forwards it there once. A node joining knows the cluster by the peer
// addresses it was given (--join), any of which may be a follower.
func (s *peerService) JoinCluster(ctx context.Context, req *shardpb.JoinClusterRequest) (*shardpb.JoinClusterResponse, error) {
	n := s.n
	// Checked before anything is proposed: an ID or address too long for
	// an AppendEntries would stop the metadata group (Apply checks again).
	if err := meta.CheckNode(req.GetNode()); err != nil {
		return nil, n.toStatus(err)
	}
	if n.meta.Raft.State() == raft.Leader {
		resp, err := n.joinCluster(req)
		return resp, n.toStatus(err)
	}
	addr, _ := n.meta.Raft.LeaderWithID()
	if md, _ := metadata.FromIncomingContext(ctx); len(md.Get(forwardedFromKey)) > 0 || addr == "" || string(addr) == n.cfg.PeerAddr {
		return nil, n.toStatus(n.notMetaLeader())
	}
	ps, err := n.peerStub(string(addr))
	if err != nil {
		return nil, n.toStatus(n.notMetaLeader())
	}
	return ps.JoinCluster(metadata.AppendToOutgoingContext(ctx, forwardedFromKey, n.cfg.ID), req)
}

// joinCluster registers the node in the map and makes it a member of the
// metadata group (a non-voter; the scheduler promotes voters), so it
// receives the map. This node must be the metadata leader.
func (n *Node) joinCluster(req *shardpb.JoinClusterRequest) (*shardpb.JoinClusterResponse, error) {
	nd := req.Node
	cluster, err := n.clusterIDOnLeader()
	if err != nil {
		return nil, fmt.Errorf("registering node %s: %w", nd.Id, err)
	}
	if req.ClusterId != "" && req.ClusterId != cluster {
		return nil, fmt.Errorf("%w: node %s's data dir belongs to cluster %s, and this is cluster %s: give it an empty data dir to join this cluster", api.ErrClusterMismatch, nd.Id, req.ClusterId, cluster)
	}
	if _, err := n.applyMeta(meta.CmdRegisterNode, nd, fmt.Sprintf("registering node %s", nd.Id)); err != nil {
		return nil, err
	}
	r := n.meta.Raft
	f := r.GetConfiguration()
	if err := f.Error(); err != nil {
		return nil, fmt.Errorf("registering node %s: %w: %v", nd.Id, api.ErrUnavailable, err)
	}
	in := false
	for _, srv := range f.Configuration().Servers {
		if string(srv.ID) == nd.Id {
			in = string(srv.Address) == nd.PeerAddr
		}
	}
	if !in {
		if err := r.AddNonvoter(raft.ServerID(nd.Id), raft.ServerAddress(nd.PeerAddr), 0, configChangeTimeout).Error(); err != nil {
			return nil, fmt.Errorf("registering node %s: %w: adding it to the metadata group: %v", nd.Id, api.ErrUnavailable, err)
		}
		n.log.Info("node joined the cluster", "node", nd.Id, "addr", nd.Addr, "peer-addr", nd.PeerAddr)
	}
	return &shardpb.JoinClusterResponse{MapVersion: n.metaFSM.Version(), ClusterId: cluster}, nil
}

func (s *service) SetNodeAdmin(ctx context.Context, req *shardpb.SetNodeAdminRequest) (*shardpb.SetNodeAdminResponse, error) {
	if req.Id == "" {
		return nil, s.n.toStatus(fmt.Errorf("%w: no node ID", api.ErrBadRequest))
	}
	return onMetaLeader(ctx, s.n, func() (*shardpb.SetNodeAdminResponse, error) {
		return &shardpb.SetNodeAdminResponse{}, s.n.setNodeAdmin(req)
	}, &shardpb.ForwardRequest{Call: &shardpb.ForwardRequest_SetNodeAdmin{SetNodeAdmin: req}}, (*shardpb.ForwardResponse).GetSetNodeAdmin)
}

// setNodeAdmin drains, removes or reactivates a node, refusing what would
// leave tables without room for their replicas, or remove a live node.
func (n *Node) setNodeAdmin(req *shardpb.SetNodeAdminRequest) error {
	if err := n.metaAuthoritative(); err != nil {
		return fmt.Errorf("node %s: %w: %v", req.Id, api.ErrUnavailable, err)
	}
	cm := n.metaFSM.ClusterMap()
	target := n.metaFSM.Node(req.Id)
	if target == nil {
		return fmt.Errorf("node %q: %w", req.Id, api.ErrUnknownNode)
	}
	if target.Admin == req.Admin {
		return nil
	}
	members := n.memberMap()
	if req.Admin == shardpb.NodeAdmin_NODE_REMOVED {
		if st := members[req.Id].State; st == membership.Alive || st == membership.Suspect {
			return fmt.Errorf("%w: node %s is %s: drain it (raftps node drain %s), stop it, then remove it", api.ErrNodeConflict, req.Id, st, req.Id)
		}
	}
	if req.Admin != shardpb.NodeAdmin_NODE_ACTIVE {
		active := 0
		for _, nd := range cm.Nodes {
			if nd.Id != req.Id && nd.Admin == shardpb.NodeAdmin_NODE_ACTIVE {
				active++
			}
		}
		for _, t := range cm.Tables {
			if int(t.Replicas) > active {
				return fmt.Errorf("%w: taking node %s away would leave %d active nodes for table %q's %d replicas; add a node first", api.ErrNodeConflict, req.Id, active, t.Name, t.Replicas)
			}
		}
	}
	_, err := n.applyMeta(meta.CmdSetNodeAdmin, req, fmt.Sprintf("making node %s %s", req.Id, meta.AdminName(req.Admin)))
	if err == nil {
		n.log.Info("node admin state changed", "node", req.Id, "admin", meta.AdminName(req.Admin))
	}
	return err
}

func (s *service) GetClusterMap(ctx context.Context, req *shardpb.GetClusterMapRequest) (*shardpb.ClusterMap, error) {
	return onMetaLeader(ctx, s.n, s.n.authoritativeMap,
		&shardpb.ForwardRequest{Call: &shardpb.ForwardRequest_GetClusterMap{GetClusterMap: req}}, (*shardpb.ForwardResponse).GetClusterMap)
}

// authoritativeMap is the cluster map as the metadata leader has it once
// it applied everything committed before the call.
func (n *Node) authoritativeMap() (*shardpb.ClusterMap, error) {
	if err := n.metaAuthoritative(); err != nil {
		return nil, fmt.Errorf("cluster map: %w: node %s %v", api.ErrUnavailable, n.cfg.ID, err)
	}
	return n.metaFSM.ClusterMap(), nil
}

// initialPlacement places a new table's shards on the live active nodes,
// balanced with the tables already placed.
func (n *Node) initialPlacement(spec *shardpb.TableSpec) (*shardpb.MetaCreateTable, error) {
	cm := n.metaFSM.ClusterMap()
	members := n.memberMap()
	var nodes []string
	for _, nd := range cm.Nodes {
		// Not dead: a node registered a moment ago may not be in this
		// node's gossip view yet.
		if nd.Admin == shardpb.NodeAdmin_NODE_ACTIVE && members[nd.Id].State != membership.Dead {
			nodes = append(nodes, nd.Id)
		}
	}
	if int(spec.Replicas) > len(nodes) {
		return nil, fmt.Errorf("%w: table %q: replicas = %d, but the cluster has %d live active nodes %v", store.ErrInvalidConfig, spec.Name, spec.Replicas, len(nodes), nodes)
	}
	current := placement.Placement{}
	tables := []placement.Table{{Name: spec.Name, Shards: int(spec.Shards), Replicas: int(spec.Replicas)}}
	for _, t := range cm.Tables {
		if t.Name == spec.Name {
			return nil, fmt.Errorf("table %q: %w", spec.Name, store.ErrTableExists)
		}
		tables = append(tables, placement.Table{Name: t.Name, Shards: int(t.Shards), Replicas: int(t.Replicas)})
		current[t.Name] = make([][]string, t.Shards)
	}
	for _, sm := range cm.Shards {
		if c := current[sm.Table]; c != nil && int(sm.Shard) < len(c) {
			c[sm.Shard] = slices.Clone(sm.Replicas)
		}
	}
	res, err := placement.Place(nodes, tables, current)
	if err != nil {
		return nil, err
	}
	cmd := &shardpb.MetaCreateTable{Spec: spec, MaxTables: uint32(min(n.cfg.MaxTables, math.MaxUint32)), MaxReplicasPerNode: uint32(min(n.cfg.MaxReplicasPerNode, math.MaxUint32))}
	for s, reps := range res.Placement[spec.Name] {
		cmd.Shards = append(cmd.Shards, &shardpb.ShardMap{Table: spec.Name, Shard: uint32(s), Replicas: reps, Epoch: 1})
	}
	return cmd, nil
}

// waitPeersRegistered waits, for a while, until every static peer is in the
// map and gossip has heard from it: a table created just after a static
// cluster started is placed on all of it, not on the nodes that happened to
// register first. Gossip shows a static peer it never heard from as dead,
// and a peer can register through the metadata group before its first
// gossip reaches this node. A peer still silent after the wait is treated
// as what it looks like: dead.
func (n *Node) waitPeersRegistered(ctx context.Context) {
	var ids []string
	for _, p := range n.cfg.Peers {
		ids = append(ids, p.ID)
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_ = pollUntil(ctx, 20*time.Millisecond, func() (bool, error) {
		members := n.memberMap()
		for _, id := range ids {
			if n.metaFSM.Node(id) == nil || members[id].State == membership.Dead {
				return false, nil
			}
		}
		return true, nil
	})
}
