package client

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// DrainProgress is what is left on a draining node.
type DrainProgress struct {
	// Replicas counts the shards whose replicas include the node, or that
	// are adding it, in the metadata leader's map.
	Replicas int
	// Leaders counts the shard groups the node leads, -1 if no node that
	// answered knew.
	Leaders int
}

// Done says whether the node holds no replica and leads nothing.
func (p DrainProgress) Done() bool { return p.Replicas == 0 && p.Leaders == 0 }

func (p DrainProgress) String() string {
	leaders := fmt.Sprint(p.Leaders)
	if p.Leaders < 0 {
		leaders = "unknown"
	}
	return fmt.Sprintf("%d replicas left, leads %s shards", p.Replicas, leaders)
}

// DrainProgress counts the node's replicas in the metadata leader's map and
// the shard groups it leads: as it says itself, else as the nodes this
// client knows see it by gossip. A node not in the map is ErrUnknownNode.
func (a *Admin) DrainProgress(ctx context.Context, id string) (DrainProgress, error) {
	cm, err := a.ClusterMap(ctx)
	if err != nil {
		return DrainProgress{}, err
	}
	nd, known := cm.Node(id)
	if !known {
		return DrainProgress{}, fmt.Errorf("%w: node %s is not in the cluster map any more", ErrUnknownNode, id)
	}
	p := DrainProgress{Leaders: -1}
	for _, sm := range cm.Shards {
		if slices.Contains(sm.Replicas, id) || sm.Adding == id {
			p.Replicas++
		}
	}
	for _, addr := range append([]string{nd.Addr}, a.c.cfg.Addrs...) {
		st, err := a.NodeStatus(ctx, addr, false)
		if err != nil {
			continue
		}
		for _, o := range st.Nodes {
			if o.ID == id {
				p.Leaders = o.Leaders
			}
		}
		if p.Leaders >= 0 {
			break
		}
	}
	return p, nil
}

// WaitDrained polls DrainProgress until the node holds no replica and leads
// nothing, or ctx ends. Every poll's outcome goes to progress, if set (a
// failed poll with its error: the wait goes on). The error after ctx ends
// names what was left.
func (a *Admin) WaitDrained(ctx context.Context, id string, progress func(DrainProgress, error)) error {
	var last DrainProgress
	var lastErr error
	for {
		pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		p, err := a.DrainProgress(pctx, id)
		cancel()
		if err == nil && p.Done() {
			return nil
		}
		if progress != nil {
			progress(p, err)
		}
		last, lastErr = p, err
		select {
		case <-ctx.Done():
			if lastErr != nil {
				return fmt.Errorf("node %s not drained: %w (last poll: %w)", id, ctx.Err(), lastErr)
			}
			return fmt.Errorf("node %s not drained: %w (%s)", id, ctx.Err(), last)
		case <-time.After(250 * time.Millisecond):
		}
	}
}
