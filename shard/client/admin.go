package client

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/raftps/raftps/shard/shardpb"
)

// Admin reads the cluster's state and changes nodes' admin states. Get it
// from Client.Admin; it is safe for concurrent use.
type Admin struct{ c *Client }

// Admin returns the client's administration API.
func (c *Client) Admin() *Admin { return &Admin{c: c} }

// NodeAdmin is a node's admin state in the cluster map.
type NodeAdmin string

// The admin states: a node holds replicas (active), has every replica and
// leadership moved off it (draining), or is forgotten (removed: treated as
// failed at once, its entry deleted once it holds no replica).
const (
	NodeActive   NodeAdmin = "active"
	NodeDraining NodeAdmin = "draining"
	NodeRemoved  NodeAdmin = "removed"
)

func (a NodeAdmin) proto() (shardpb.NodeAdmin, error) {
	switch a {
	case NodeActive:
		return shardpb.NodeAdmin_NODE_ACTIVE, nil
	case NodeDraining:
		return shardpb.NodeAdmin_NODE_DRAINING, nil
	case NodeRemoved:
		return shardpb.NodeAdmin_NODE_REMOVED, nil
	}
	return 0, fmt.Errorf("%w: node admin state %q (want active, draining or removed)", ErrBadRequest, a)
}

func adminOf(a shardpb.NodeAdmin) NodeAdmin {
	switch a {
	case shardpb.NodeAdmin_NODE_ACTIVE:
		return NodeActive
	case shardpb.NodeAdmin_NODE_DRAINING:
		return NodeDraining
	case shardpb.NodeAdmin_NODE_REMOVED:
		return NodeRemoved
	}
	return NodeAdmin(a.String())
}

// SetNodeAdmin drains (NodeDraining), removes (NodeRemoved) or reactivates
// (NodeActive) the node with ID id. Draining moves every replica and
// leadership off the node, at the scheduler's pace; removing forgets a node
// that is not alive. Both are refused (ErrNodeConflict) if the other active
// nodes cannot hold every table's replicas; an unknown node is
// ErrUnknownNode.
func (a *Admin) SetNodeAdmin(ctx context.Context, id string, admin NodeAdmin) error {
	p, err := admin.proto()
	if err != nil {
		return err
	}
	err = a.c.callMeta(ctx, func(ctx context.Context, s shardpb.ParameterServerClient) error {
		_, err := s.SetNodeAdmin(ctx, &shardpb.SetNodeAdminRequest{Id: id, Admin: p})
		return err
	})
	if errors.Is(err, ErrUnknownNode) {
		return fmt.Errorf("making node %s %s: no node %q in the cluster map (the nodes' IDs are in the status): %w", id, admin, id, err)
	}
	if err != nil {
		return fmt.Errorf("making node %s %s: %w", id, admin, err)
	}
	return nil
}

// MapNode is one node of the cluster map.
type MapNode struct {
	ID string `json:"id"`
	// Addr is the client API's address; PeerAddr the peer API's (Raft,
	// chains, node-to-node calls); GossipAddr memberlist's.
	Addr       string    `json:"addr"`
	PeerAddr   string    `json:"peer_addr"`
	GossipAddr string    `json:"gossip_addr"`
	Admin      NodeAdmin `json:"admin"`
}

// Placement is one shard's entry in the cluster map.
type Placement struct {
	Table string `json:"table"`
	Shard int    `json:"shard"`
	// Replicas are node IDs, the preferred leader (a chain's head) first;
	// Adding a node catching up as a non-voter, or "".
	Replicas []string `json:"replicas"`
	Adding   string   `json:"adding,omitempty"`
	Epoch    uint64   `json:"epoch"`
}

func placementOf(sm *shardpb.ShardMap) Placement {
	return Placement{Table: sm.GetTable(), Shard: int(sm.GetShard()), Replicas: sm.GetReplicas(), Adding: sm.GetAdding(), Epoch: sm.GetEpoch()}
}

// ClusterMap is the metadata group's map of the cluster.
type ClusterMap struct {
	Version uint64      `json:"version"`
	Nodes   []MapNode   `json:"nodes"`
	Shards  []Placement `json:"shards"`
	Tables  []TableSpec `json:"tables"`
}

// Node returns the map's node with ID id.
func (m ClusterMap) Node(id string) (MapNode, bool) {
	for _, n := range m.Nodes {
		if n.ID == id {
			return n, true
		}
	}
	return MapNode{}, false
}

// Shard returns the map's entry of table/shard.
func (m ClusterMap) Shard(table string, shard int) (Placement, bool) {
	for _, p := range m.Shards {
		if p.Table == table && p.Shard == shard {
			return p, true
		}
	}
	return Placement{}, false
}

func clusterMapOf(cm *shardpb.ClusterMap) ClusterMap {
	out := ClusterMap{Version: cm.GetVersion()}
	for _, n := range cm.GetNodes() {
		out.Nodes = append(out.Nodes, MapNode{ID: n.Id, Addr: n.Addr, PeerAddr: n.PeerAddr, GossipAddr: n.GossipAddr, Admin: adminOf(n.Admin)})
	}
	for _, sm := range cm.GetShards() {
		out.Shards = append(out.Shards, placementOf(sm))
	}
	for _, t := range cm.GetTables() {
		out.Tables = append(out.Tables, specOf(t))
	}
	return out
}

// ClusterMap returns the cluster map as the metadata leader has it.
func (a *Admin) ClusterMap(ctx context.Context) (ClusterMap, error) {
	var out *shardpb.ClusterMap
	err := a.c.callMeta(ctx, func(ctx context.Context, s shardpb.ParameterServerClient) (err error) {
		out, err = s.GetClusterMap(ctx, &shardpb.GetClusterMapRequest{})
		return err
	})
	if err != nil {
		return ClusterMap{}, fmt.Errorf("reading the cluster map: %w", err)
	}
	return clusterMapOf(out), nil
}

// NodeStatus asks the node at addr for its status, once (no retries: the
// caller wants this node's view). With checksums every replica reports the
// checksum of its rows, which costs a pass over each table.
func (a *Admin) NodeStatus(ctx context.Context, addr string, checksums bool) (NodeStatus, error) {
	s, err := a.c.stub(addr)
	if err != nil {
		return NodeStatus{}, err
	}
	actx, cancel := context.WithTimeout(ctx, a.c.cfg.AttemptTimeout)
	defer cancel()
	resp, err := s.Status(actx, &shardpb.StatusRequest{Checksums: checksums})
	if err != nil {
		return NodeStatus{}, fmt.Errorf("status of %s: %w", addr, a.c.callFailed(ctx, actx, addr, err))
	}
	return StatusFromProto(resp), nil
}

// StatusOptions choose what ClusterStatus asks.
type StatusOptions struct {
	// Checksums: every replica's checksum (a pass over its rows).
	Checksums bool
	// Timeout bounds the wait for each node (default 3s).
	Timeout time.Duration
}
