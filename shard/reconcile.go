package shard

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/raftps/raftps/shard/api"
	"github.com/raftps/raftps/shard/membership"
	"github.com/raftps/raftps/shard/meta"

	"github.com/hashicorp/raft"
	"github.com/raftps/raftps/replication"
	"github.com/raftps/raftps/shard/shardpb"
)

// What every node does with the cluster map, whoever leads the metadata
// group (reconcileLoop, on every map change and every second):
//
//   - registers itself (JoinCluster) until the map has it at its address;
//   - opens a replica of every shard the map places on it (as a voter, or
//     as the node being added), bootstrapping the group only if the entry
//     is as created (epoch 1);
//   - closes the replicas the map no longer places on it, and deletes their
//     data once the group's leader confirms the node is out of the group;
//   - for every group it leads whose preferred leader (the first replica)
//     is another live voter, hands leadership over, at most once per group
//     per leaderTransferEvery, so leaders follow the placement's balance;
//   - gossips its map version and leader count.

const (
	reconcileInterval = time.Second
	// gcPerTick bounds the retired groups asked about per reconcile pass:
	// each costs a call to the group's leader.
	gcPerTick = 4
	// driftGrace is how long a settled shard's Raft configuration must
	// differ from its map entry before the shard's leader corrects it: a
	// scheduler step changes the one and then the other, and is not drift.
	driftGrace = 30 * time.Second
	// leaderTransferEvery bounds how often a group's leadership is moved to
	// its preferred leader, and preferredAliveFor how long that node must
	// have been alive first: a node that restarts gets its leaderships back
	// only once it has stayed up a while.
	leaderTransferEvery = 10 * time.Second
	preferredAliveFor   = 3 * time.Second
)

func (n *Node) reconcileLoop() {
	retry := time.NewTicker(reconcileInterval)
	defer retry.Stop()
	n.findRetired()
	n.findLeftChains()
	for {
		select {
		case <-n.closed:
			return
		case <-n.kick:
		case <-retry.C:
		}
		cm := n.metaFSM.ClusterMap()
		if !n.identityConfirmed {
			// No replica opens before the metadata leader has confirmed
			// that this data dir is of its cluster (identity.go).
			if n.identityConfirmed = n.confirmIdentity(cm); !n.identityConfirmed {
				time.AfterFunc(100*time.Millisecond, n.kickReconcile)
				continue
			}
		} else if _, err := n.register(cm, false); err != nil && errors.Is(err, api.ErrClusterMismatch) {
			n.fail(err)
			continue
		}
		n.checkClusterID()
		known := map[string]string{}
		for _, nd := range cm.Nodes {
			known[nd.Id] = nd.GossipAddr
		}
		n.members.SetKnown(known)
		n.reconcileGroups(cm)
		n.reconcileDropped(cm)
		n.reportBrokenChains()
		n.reportSetAside()
		n.balanceLeaders(cm)
		n.repairDrift(cm)
		n.gcRetired(cm)
		n.gcLeftChains()
		n.sweepNodeLog()
		n.members.SetLocal(cm.Version, n.leaderCount())
	}
}

// register asks the metadata leader to put this node in the map, unless the
// map has it at its current addresses already and force is false. The
// request carries the data dir's cluster ID; the answer is the cluster's.
func (n *Node) register(cm *shardpb.ClusterMap, force bool) (string, error) {
	for _, nd := range cm.Nodes {
		if !force && nd.Id == n.cfg.ID && nd.Addr == n.cfg.Addr && nd.PeerAddr == n.cfg.PeerAddr && nd.GossipAddr == n.gossipAddr {
			return n.ClusterID(), nil
		}
	}
	req := &shardpb.JoinClusterRequest{Node: &shardpb.ClusterNode{Id: n.cfg.ID, Addr: n.cfg.Addr, PeerAddr: n.cfg.PeerAddr, GossipAddr: n.gossipAddr}, ClusterId: n.ClusterID()}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if n.meta.Raft.State() == raft.Leader {
		resp, err := n.joinCluster(req)
		if err != nil {
			n.log.Warn("registering in the cluster map", "error", err)
			return "", err
		}
		return resp.ClusterId, nil
	}
	addrs := slices.Clone(n.cfg.Join)
	if a, _ := n.meta.Raft.LeaderWithID(); a != "" {
		addrs = append([]string{string(a)}, addrs...)
	}
	for _, p := range n.cfg.Peers {
		if p.ID != n.cfg.ID {
			addrs = append(addrs, p.PeerAddr)
		}
	}
	last := errors.New("no metadata leader known and no peer to ask")
	for _, a := range addrs {
		ps, err := n.peerStub(a)
		if err != nil {
			last = err
			continue
		}
		resp, err := ps.JoinCluster(ctx, req)
		if err != nil {
			last = fromStatus(err)
			if errors.Is(last, api.ErrClusterMismatch) {
				return "", last
			}
			continue
		}
		n.log.Info("registered in the cluster map", "via", a)
		return resp.ClusterId, nil
	}
	n.log.Debug("registering in the cluster map; retrying", "error", last)
	return "", last
}

// reconcileGroups opens and closes this node's replicas to match the map.
func (n *Node) reconcileGroups(cm *shardpb.ClusterMap) {
	specs := map[string]*shardpb.TableSpec{}
	for _, t := range cm.Tables {
		specs[t.Name] = t
	}
	addrOf := peerAddrs(cm)
	inMap := map[string]bool{}
	for _, sm := range cm.Shards {
		if spec := specs[sm.Table]; spec != nil && api.IsChain(spec) {
			n.reconcileChain(sm, spec, addrOf)
			continue
		}
		id := meta.ShardMapKey(sm)
		member := isReplica(sm, n.cfg.ID) || sm.Adding == n.cfg.ID
		inMap[id] = member
		open := n.Group(sm.Table, sm.Shard) != nil
		if n.setAside.blocked(id, isReplica(sm, n.cfg.ID)) {
			continue // set aside: not reopened until the map removes this node (setaside.go)
		}
		switch {
		case member && !open:
			spec := specs[sm.Table]
			if spec == nil {
				continue
			}
			cfg, err := api.TableConfig(spec)
			if err != nil {
				n.log.Error("table spec in metadata is invalid", "table", spec.Name, "error", err)
				continue
			}
			var peers []raft.Server
			if sm.Epoch == 1 && sm.Adding == "" {
				for _, r := range sm.Replicas {
					peers = append(peers, raft.Server{ID: raft.ServerID(r), Address: raft.ServerAddress(addrOf[r])})
				}
			}
			delete(n.retired, id)
			if err := n.prepareReplicaDir(n.groupDir(id), sm.Incarnation); err != nil {
				n.log.Error("preparing shard replica directory", "group", id, "error", err)
				continue
			}
			if err := n.openGroup(id, cfg, peers); err != nil {
				if !n.openFailed(id, n.groupDir(id), false, err) {
					n.log.Error("opening shard replica", "group", id, "error", err)
				}
			} else {
				n.log.Info("shard replica opened", "group", id, "epoch", sm.Epoch, "bootstrap", len(peers) > 0)
			}
		case !member && open:
			if err := n.closeGroup(id); err != nil {
				n.log.Warn("closing a shard replica moved away", "group", id, "error", err)
			}
			n.log.Info("shard replica closed: the map moved it away", "group", id, "epoch", sm.Epoch)
			n.retired[id] = true
		}
	}
}

// findRetired marks the groups on disk that this node's map (as restored
// at start) does not place here: gcRetired deletes them once their leader
// confirms.
func (n *Node) findRetired() {
	for table, sh := range replicaDirs(filepath.Join(n.cfg.DataDir, "groups")) {
		sm := n.metaFSM.ShardMap(table, sh)
		if sm != nil && !isReplica(sm, n.cfg.ID) && sm.Adding != n.cfg.ID {
			n.retired[api.GroupID(table, sh)] = true
		}
	}
}

// replicaDirs yields the table and shard of every replica directory
// root/TABLE/SHARD (the layout of both groups/ and chains/).
func replicaDirs(root string) iter.Seq2[string, uint32] {
	return func(yield func(string, uint32) bool) {
		tables, err := os.ReadDir(root)
		if err != nil {
			return
		}
		for _, t := range tables {
			shards, err := os.ReadDir(filepath.Join(root, t.Name()))
			if err != nil {
				continue
			}
			for _, s := range shards {
				var sh uint32
				if _, err := fmt.Sscanf(s.Name(), "%d", &sh); err != nil || s.Name() != fmt.Sprint(sh) {
					continue
				}
				if !yield(t.Name(), sh) {
					return
				}
			}
		}
	}
}

// gcRetired deletes the data of retired groups whose leader confirms this
// node is no member: only then can the data not be needed, since a member
// that lost its log could vote a stale candidate in.
func (n *Node) gcRetired(cm *shardpb.ClusterMap) {
	asked := 0
	for _, id := range slices.Sorted(maps.Keys(n.retired)) {
		if asked >= gcPerTick {
			return
		}
		var sm *shardpb.ShardMap
		for _, x := range cm.Shards {
			if meta.ShardMapKey(x) == id {
				sm = x
			}
		}
		if sm == nil || isReplica(sm, n.cfg.ID) || sm.Adding == n.cfg.ID || n.groupOpen(id) {
			continue
		}
		asked++
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		query := &shardpb.ReconfigureRequest{Table: sm.Table, Shard: sm.Shard, Op: shardpb.ReconfigureOp_RECONFIGURE_QUERY}
		resp, err := n.callShardLeader(ctx, sm, query)
		if err == nil && resp.State != "leader" && resp.LeaderAddr != "" {
			// callShardLeader returns the first replica that answers; the
			// leader's word is the one that counts.
			resp, err = n.callReconfigure(ctx, resp.LeaderAddr, query)
		}
		cancel()
		if err != nil || resp.State != "leader" || slices.Contains(resp.Voters, n.cfg.ID) || slices.Contains(resp.Nonvoters, n.cfg.ID) {
			continue
		}
		if err := n.removeReplicaDir(n.groupDir(id)); err != nil {
			n.log.Warn("deleting a moved-away replica", "group", id, "error", err)
			continue
		}
		delete(n.retired, id)
		n.log.Info("moved-away replica deleted", "group", id)
	}
}

func (n *Node) groupOpen(id string) bool {
	n.mu.RLock()
	defer n.mu.RUnlock()
	return n.groups[id] != nil
}

// balanceLeaders hands the leadership of groups this node leads to their
// preferred leader when that is another live voter.
func (n *Node) balanceLeaders(cm *shardpb.ClusterMap) {
	alive := n.memberMap()
	addrOf := peerAddrs(cm)
	now := time.Now()
	for _, sm := range cm.Shards {
		if len(sm.Replicas) == 0 || sm.Replicas[0] == n.cfg.ID || sm.Adding != "" {
			continue
		}
		g := n.Group(sm.Table, sm.Shard)
		if g == nil || !g.IsLeader() || !isReplica(sm, n.cfg.ID) {
			continue
		}
		id := meta.ShardMapKey(sm)
		pref := sm.Replicas[0]
		m, ok := alive[pref]
		if !ok || m.State != membership.Alive || now.Sub(m.Since) < preferredAliveFor || now.Sub(n.lastTransfer[id]) < leaderTransferEvery {
			continue
		}
		if suf, in, err := suffrageOf(g.Raft(), pref); err != nil || !in || suf != raft.Voter {
			continue
		}
		n.lastTransfer[id] = now
		r, addr := g.Raft(), addrOf[pref]
		n.wg.Go(func() {
			if err := replication.Await(r, g.TransferLeadership(raft.ServerID(pref), raft.ServerAddress(addr))); err != nil {
				n.log.Debug("leadership transfer to the preferred leader", "group", id, "to", pref, "error", err)
				return
			}
			n.log.Info("leadership handed to the preferred leader", "group", id, "to", pref)
		})
	}
}

// repairDrift corrects, on the groups this node leads, a Raft configuration
// that has differed from the shard's settled map entry for driftGrace:
// members the map does not list are removed, replicas it lists that the
// group lacks are added (caught up first). A step of a deposed scheduler
// that reached the group after the map moved on is how that can happen;
// the map is the truth.
func (n *Node) repairDrift(cm *shardpb.ClusterMap) {
	now := time.Now()
	addrOf := peerAddrs(cm)
	seen := map[string]bool{}
	for _, sm := range cm.Shards {
		id := meta.ShardMapKey(sm)
		g := n.Group(sm.Table, sm.Shard)
		if g == nil || !g.IsLeader() || sm.Adding != "" || !isReplica(sm, n.cfg.ID) {
			continue
		}
		f := g.Raft().GetConfiguration()
		if f.Error() != nil {
			continue
		}
		var extra, missing, voters []string
		for _, srv := range f.Configuration().Servers {
			if srv.Suffrage == raft.Voter {
				voters = append(voters, string(srv.ID))
			}
			if !slices.Contains(sm.Replicas, string(srv.ID)) {
				extra = append(extra, string(srv.ID))
			}
		}
		for _, m := range sm.Replicas {
			if !slices.Contains(voters, m) {
				missing = append(missing, m)
			}
		}
		if len(extra) == 0 && len(missing) == 0 {
			continue
		}
		key := fmt.Sprintf("%s@%d", id, sm.Epoch)
		seen[key] = true
		first, ok := n.drift[key]
		if !ok {
			n.drift[key] = now
			continue
		}
		if now.Sub(first) < driftGrace {
			continue
		}
		delete(n.drift, key)
		n.log.Warn("shard group configuration differs from the cluster map; correcting", "group", id, "epoch", sm.Epoch, "not_in_map", extra, "not_in_group", missing)
		r, table, shard := g, sm.Table, sm.Shard
		n.wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), moveTimeout)
			defer cancel()
			for _, m := range missing {
				if err := n.addReplica(ctx, r, table, shard, m, addrOf[m]); err != nil {
					n.log.Warn("adding a replica the map lists", "group", id, "node", m, "error", err)
					return
				}
			}
			for _, m := range extra {
				if err := n.removeReplica(r, m); err != nil {
					n.log.Warn("removing a member the map does not list", "group", id, "node", m, "error", err)
					return
				}
			}
		})
	}
	for key := range n.drift {
		if !seen[key] {
			delete(n.drift, key)
		}
	}
}

// waitTableReady waits until every shard of the table has a leader, asking
// each shard's replicas.
func (n *Node) waitTableReady(ctx context.Context, spec *shardpb.TableSpec) error {
	for s := range spec.Shards {
		sm := n.metaFSM.ShardMap(spec.Name, s)
		if sm == nil {
			return fmt.Errorf("table %q: %w: shard %d has no map entry", spec.Name, api.ErrUnavailable, s)
		}
		err := pollUntil(ctx, 20*time.Millisecond, func() (bool, error) {
			qctx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			resp, err := n.callShardLeader(qctx, sm, &shardpb.ReconfigureRequest{Table: spec.Name, Shard: s, Op: shardpb.ReconfigureOp_RECONFIGURE_QUERY})
			return err == nil && resp.LeaderAddr != "", nil
		})
		if err != nil {
			return fmt.Errorf("table %q: %w: shard %d has no leader: %w", spec.Name, api.ErrUnavailable, s, err)
		}
	}
	return nil
}

// isReplica reports whether node id is one of the shard's voters in sm.
func isReplica(sm *shardpb.ShardMap, id string) bool {
	return sm != nil && slices.Contains(sm.Replicas, id)
}

// peerAddrs maps each node of the map to its peer address.
func peerAddrs(cm *shardpb.ClusterMap) map[string]string {
	out := make(map[string]string, len(cm.Nodes))
	for _, nd := range cm.Nodes {
		out[nd.Id] = nd.PeerAddr
	}
	return out
}
