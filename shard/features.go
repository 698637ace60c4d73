package shard

import (
	"context"
	"fmt"
	"time"

	"github.com/raftps/raftps/shard/api"
	"github.com/raftps/raftps/shard/membership"
	"github.com/raftps/raftps/shard/shardpb"
)

// Node features: what this node's build can do that an older one cannot
// (api.NodeFeatures), gossiped with its membership metadata, so that a
// setting an older node would get wrong is refused until every node has it.

// nodeFeatures is what this node gossips it can do (api.NodeFeatures).
func nodeFeatures(cfg NodeConfig) uint32 {
	if cfg.GossipFeatures != nil {
		return *cfg.GossipFeatures
	}
	return api.NodeFeatures
}

// everyNodeHas returns nil if every node of the cluster map that is not
// removed gossips feature, else an error (ErrInvalidConfig) that names
// the first that does not, or is not heard from: what is asked for would
// go wrong on a node of an older build (what names it).
func (n *Node) everyNodeHas(feature uint32, what string) error {
	members := map[string]membership.Member{}
	for _, m := range n.Members() {
		members[m.ID] = m
	}
	for _, nd := range n.ClusterMap().GetNodes() {
		if nd.Admin == shardpb.NodeAdmin_NODE_REMOVED {
			continue
		}
		m, ok := members[nd.Id]
		switch {
		case !ok || m.State != membership.Alive:
			state := "unknown"
			if ok {
				state = m.State
			}
			return fmt.Errorf("%w: %s needs every node's build to support it, and node %s is not heard from (gossip: %s): try again once it is up", api.ErrInvalidConfig, what, nd.Id, state)
		case m.Features&feature == 0:
			return fmt.Errorf("%w: %s: node %s runs a build that does not support it; upgrade every node first", api.ErrInvalidConfig, what, nd.Id)
		}
	}
	return nil
}

// featureGrace is how long waitEveryNodeHas waits for a node that has just
// started to gossip its features before refusing.
const featureGrace = 2 * time.Second

// waitEveryNodeHas is everyNodeHas, asked again for up to featureGrace
// while it fails.
func (n *Node) waitEveryNodeHas(ctx context.Context, feature uint32, what string) error {
	wctx, cancel := context.WithTimeout(ctx, featureGrace)
	defer cancel()
	var err error
	_ = pollUntil(wctx, 100*time.Millisecond, func() (bool, error) {
		err = n.everyNodeHas(feature, what)
		return err == nil, nil
	})
	return err
}
