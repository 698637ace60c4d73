package shard

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/raftps/raftps/shard/api"
	"github.com/raftps/raftps/shard/membership"
	"github.com/raftps/raftps/shard/meta"

	"github.com/raftps/raftps/shard/shardpb"
)

// Chain shards in the cluster map. A shard of a chain table (TableSpec
// replication "chain") is a chain.Chain whose order is the entry's
// replica list, head first, and whose epoch is the entry's epoch: every node
// hands its replica SetConfig(epoch, addresses of the replicas) when it sees
// the entry change (reconcile.go), and every change of the entry bumps the
// epoch (meta.CmdSetShard's compare-and-set). The chain nodes never change their
// order themselves; gossip only tells the metadata leader who is dead.
//
// The chain core needs every member's log to be a prefix of its
// predecessor's (see replication's "Chain replication"). So the scheduler
// changes a chain's order only in these ways, one per epoch:
//
//   - remove a member (dead, or a rebalancing move's old node); the others
//     keep their relative order, so a removed head's successor becomes head
//     and a removed tail's predecessor becomes tail;
//   - append a node at the tail (a repair, or a rebalancing move's new
//     node); it copies the old tail's state before it can commit anything.
//
// It never inserts a node in the middle or at the head and never reorders:
// a rebalancing move is an append, then (a new epoch) a removal, and the
// target placement's order (its preferred leader) is ignored for chains.
//
// A chain stalls while any member is down (its pushes cannot reach the
// tail), unlike a Raft group, which only needs a majority: so a member is
// removed as soon as the metadata leader has not heard from it for the chain
// silence (scheduler.silentNodes) or gossip declares it dead, not after the
// repair grace;
// the grace only decides, as for Raft tables, whether it may come back
// (placement.Place keeps it in the target) or is replaced by another node.
// The last live member is never removed. A node restarted within the grace is
// appended at the tail again, and catches up from its predecessor. A change
// that gives the chain a new head is made only once that member says it is
// caught up (Node.chainCaughtUp).

// chainStep is the next entry of a chain shard whose order is order, on its
// way to target, or nil if there is nothing to do. dead says which nodes
// gossip has declared dead (or that have failed); canAdd which may join
// now. Pure, for tests.
func chainStep(order, target []string, dead, canAdd func(id string) bool) []string {
	if !slices.ContainsFunc(order, func(id string) bool { return !dead(id) }) {
		return nil // nobody to hand the chain to: wait for a restart
	}
	for i, id := range order {
		if dead(id) {
			return slices.Delete(slices.Clone(order), i, i+1)
		}
	}
	if len(order) > len(target) {
		for i, id := range order {
			if !slices.Contains(target, id) {
				return slices.Delete(slices.Clone(order), i, i+1)
			}
		}
	}
	for _, id := range target {
		if !slices.Contains(order, id) && canAdd(id) {
			return append(slices.Clone(order), id)
		}
	}
	return nil
}

// chainDead: this metadata leader has not heard from the node for the
// chain silence, gossip has declared it dead (however briefly), or it failed
// (removed, unknown).
func (v *view) chainDead(id string) bool {
	if v.failed(id) || v.silent[id] {
		return true
	}
	m, ok := v.member[id]
	return ok && m.State == membership.Dead
}

// chainRound moves one chain shard a step towards target. adds is the
// round's budget of shards gaining a replica (of the kind of sm), shared
// with Raft shards.
func (sc *scheduler) chainRound(ctx context.Context, sm *shardpb.ShardMap, target []string, v *view, adds *int) {
	canAdd := func(id string) bool {
		sc.mu.Lock()
		cooling := v.now.Before(sc.cooldown[id])
		sc.mu.Unlock()
		return v.alive(id) && !cooling && *adds < sc.n.cfg.MaxMoves
	}
	group := meta.ShardMapKey(sm)
	dead := func(id string) bool {
		// A set-aside report counts at the epoch it was made in only: the
		// removal bumps the epoch, and so does appending the node again.
		if r, ok := sc.n.broken.get(group, id, v.now); ok && (!r.setAside || r.epoch == sm.Epoch) {
			if !r.setAside {
				sc.mu.Lock()
				sc.cooldown[id] = v.now.Add(addCooldown) // its disk may fail again
				sc.mu.Unlock()
			}
			return true
		}
		return v.chainDead(id)
	}
	next := chainStep(sm.Replicas, target, dead, canAdd)
	if next == nil && sm.Adding == "" {
		return
	}
	if next == nil { // an entry a Raft step could have left: chains add at once
		next = sm.Replicas
	}
	if len(next) > len(sm.Replicas) {
		*adds++
	}
	sc.start(ctx, sm, "chain", func(ctx context.Context) error {
		if len(sm.Replicas) > 0 && next[0] != sm.Replicas[0] {
			if err := sc.n.chainCaughtUp(ctx, sm, next[0]); err != nil {
				return err
			}
		}
		_, err := sc.setShard(sm, next, "")
		return err
	})
}

// chainCaughtUp returns nil if node id's replica of sm's chain is caught up
// in sm's epoch: only then may it become head. A head's log is the chain's
// truth (the others' are prefixes of it), so a member that was appended and
// has not yet received its predecessor's state must not become head, even if
// every member ahead of it is dead: the chain then waits for one of them to
// come back rather than lose what they hold.
func (n *Node) chainCaughtUp(ctx context.Context, sm *shardpb.ShardMap, id string) error {
	nd := n.metaFSM.Node(id)
	if nd == nil {
		return fmt.Errorf("node %q: %w", id, api.ErrUnknownNode)
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	st, err := n.statusOf(ctx, nd.PeerAddr)
	if err != nil {
		return fmt.Errorf("chain %s: asking %s whether it can become head: %w", meta.ShardMapKey(sm), id, err)
	}
	for _, rs := range st.Replicas {
		if rs.Group == meta.ShardMapKey(sm) && rs.Replication == api.ReplicationChain && rs.ChainEpoch == sm.Epoch && rs.ChainCaughtUp {
			return nil
		}
	}
	return fmt.Errorf("chain %s: %w: %s is not caught up in epoch %d, so it cannot become head yet", meta.ShardMapKey(sm), api.ErrUnavailable, id, sm.Epoch)
}
