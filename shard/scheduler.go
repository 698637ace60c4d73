package shard

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/raftps/raftps/shard/api"
	"github.com/raftps/raftps/shard/membership"
	"github.com/raftps/raftps/shard/meta"
	"github.com/raftps/raftps/shard/placement"

	"github.com/hashicorp/raft"
	"github.com/raftps/raftps/replication"
	"github.com/raftps/raftps/shard/shardpb"
)

// The scheduler runs on the metadata leader only. Every round it reads the
// cluster map and the gossip view, computes the target placement
// (placement.Place over the nodes that may hold replicas), and moves each
// shard one step towards it:
//
//	settled ──(target has a node the set lacks)──▶ adding: map records it
//	adding ──(leader: non-voter, catch up, voter)──▶ map: replicas + node
//	more replicas than wanted ──(leader: remove one)──▶ map: replicas − node
//	same set, other order ──▶ map: new order (the new first one takes over
//	                          leadership: see Node.balanceLeaders)
//
// Every step is idempotent and records its outcome in the map with a
// compare-and-set on the shard's epoch, so a new metadata leader resumes any
// step the old one left half done: it finds the map as the old leader left it
// and repeats the step, whose Raft half is a no-op if it was done. A replica
// is removed only after its replacement is a voter: the group never has
// fewer voters than the table's replication factor, and a majority of them
// stays reachable whenever it was before.
//
// A node is failed when it is removed, or gossip has shown it dead for the
// repair grace period. A failed node holds no place in the target; a node
// dead for less keeps its replicas (a restart is cheaper than a repair) but
// receives no new one.

// Scheduler defaults.
const (
	DefaultRepairGrace = 30 * time.Second
	DefaultMaxMoves    = 4
	schedulerInterval  = 500 * time.Millisecond
	// moveTimeout bounds one step of one shard (a catch-up by snapshot of a
	// large shard included); the next round retries it.
	moveTimeout = 10 * time.Minute
)

// scheduler is the metadata leader's placement loop.
//
// Concurrency: run is one goroutine; the steps it starts run in their own
// goroutines, tracked in inflight (guarded by mu) so a shard has at most one
// step under way.
type scheduler struct {
	n *Node

	mu       sync.Mutex
	inflight map[string]bool // by api.GroupID
	// formed: epoch-1 shards whose group has been seen with a leader. An
	// entry at epoch 1 is the only one whose replicas bootstrap the group,
	// so it is left alone until the group exists.
	formed map[string]bool
	// failures counts failed add steps per (group, node); after
	// maxAddFailures the add is aborted and the node is not given new
	// replicas until cooldown[node].
	failures map[string]int
	cooldown map[string]time.Time
	// leaderSince is when this node's current term as metadata leader
	// began; lastRound when the last round ran. Both are read and written
	// by run's goroutine only.
	leaderSince, lastRound time.Time
}

const (
	maxAddFailures = 3
	addCooldown    = 2 * time.Minute
)

func (n *Node) schedulerLoop() {
	sc := &scheduler{n: n, inflight: map[string]bool{}, formed: map[string]bool{}, failures: map[string]int{}, cooldown: map[string]time.Time{}}
	t := time.NewTicker(schedulerInterval)
	defer t.Stop()
	// term's context lives while this node leads the metadata group: the
	// steps a round starts end when it stops leading.
	var term struct {
		ctx    context.Context
		cancel context.CancelFunc
	}
	stop := func() {
		if term.cancel != nil {
			term.cancel()
			term.cancel = nil
		}
	}
	defer stop()
	for {
		select {
		case <-n.closed:
			return
		case <-t.C:
		}
		if n.meta.Raft.State() != raft.Leader {
			stop()
			continue
		}
		if term.cancel == nil {
			term.ctx, term.cancel = context.WithCancel(context.Background())
			sc.leaderSince = time.Now()
		}
		sc.round(term.ctx)
	}
}

// view is what one round knows of the nodes.
type view struct {
	nodes  map[string]*shardpb.ClusterNode
	member map[string]membership.Member
	// silent: nodes this metadata leader has not heard from for the chain
	// silence (see silentNodes).
	silent map[string]bool
	grace  time.Duration
	now    time.Time
}

func (sc *scheduler) newView(cm *shardpb.ClusterMap) *view {
	v := &view{nodes: map[string]*shardpb.ClusterNode{}, member: sc.n.memberMap(), grace: sc.n.cfg.RepairGrace, now: time.Now()}
	for _, nd := range cm.Nodes {
		v.nodes[nd.Id] = nd
	}
	v.silent = sc.silentNodes(cm, v.now)
	sc.lastRound = v.now
	return v
}

// silentNodes returns the nodes this metadata leader has not heard from
// for the chain silence (NodeConfig.ChainSilence), by its transport's
// record of the last message from each (replication.Mux.LastHeard). The
// leader heartbeats every node of the metadata group, voters and
// non-voters, ten times per heartbeat timeout, and hears each answer: a
// silent node is dead, paused or cut off from it. Gossip takes seconds to
// say as much, and a chain stalls while any member is down, so the
// scheduler removes silent chain members at once (chainDead); Raft groups,
// which only need a majority, still wait for gossip.
//
// Its own gaps are not others' silence: nothing is silent until this node
// has led for the silence (a new leader heartbeats every node at once, and a
// live one answers well within it), nor in a round that follows the last one
// late (this process was paused, or starved).
func (sc *scheduler) silentNodes(cm *shardpb.ClusterMap, now time.Time) map[string]bool {
	n := sc.n
	s := n.chainSilence()
	if s <= 0 || now.Sub(sc.leaderSince) < s || sc.lastRound.IsZero() || now.Sub(sc.lastRound) > 2*schedulerInterval {
		return nil
	}
	var out map[string]bool
	for _, nd := range cm.Nodes {
		if nd.Id == n.cfg.ID || nd.Admin == shardpb.NodeAdmin_NODE_REMOVED {
			continue
		}
		if t, ok := n.mux.LastHeard(raft.ServerAddress(nd.PeerAddr)); ok && now.Sub(t) > s {
			if out == nil {
				out = map[string]bool{}
			}
			out[nd.Id] = true
		}
	}
	return out
}

func (v *view) alive(id string) bool {
	m, ok := v.member[id]
	return ok && m.State == membership.Alive
}

// failed: removed, unknown, or dead (not merely suspect) for the grace period.
func (v *view) failed(id string) bool {
	nd := v.nodes[id]
	if nd == nil || nd.Admin == shardpb.NodeAdmin_NODE_REMOVED {
		return true
	}
	m, ok := v.member[id]
	if !ok {
		return false // not heard of yet: give it time
	}
	return m.State == membership.Dead && v.now.Sub(m.Since) >= v.grace
}

// placeable: may hold replicas in the target.
func (v *view) placeable(id string) bool {
	nd := v.nodes[id]
	return nd != nil && nd.Admin == shardpb.NodeAdmin_NODE_ACTIVE && !v.failed(id)
}

func (sc *scheduler) round(ctx context.Context) {
	n := sc.n
	sc.metaChanges()
	// The map is read after the metadata changes above (which may block),
	// and every step re-checks its shard's epoch before it acts.
	cm := n.metaFSM.ClusterMap()
	v := sc.newView(cm)
	var nodes []string
	for _, nd := range cm.Nodes {
		if v.placeable(nd.Id) {
			nodes = append(nodes, nd.Id)
		}
	}
	if len(nodes) == 0 || len(cm.Tables) == 0 {
		return
	}
	current := placement.Placement{}
	var tables []placement.Table
	for _, t := range cm.Tables {
		tables = append(tables, placement.Table{Name: t.Name, Shards: int(t.Shards), Replicas: int(t.Replicas)})
		current[t.Name] = make([][]string, t.Shards)
	}
	for _, sm := range cm.Shards {
		if c := current[sm.Table]; c != nil && int(sm.Shard) < len(c) {
			set := slices.Clone(sm.Replicas)
			if sm.Adding != "" {
				set = append(set, sm.Adding)
			}
			c[sm.Shard] = set
		}
	}
	res, err := placement.Place(nodes, tables, current)
	if err != nil {
		n.log.Error("placement", "error", err)
		return
	}
	// Repairs first: shards with a failed replica, then the rest, each in
	// map order.
	shards := slices.Clone(cm.Shards)
	hurt := func(sm *shardpb.ShardMap) int {
		for _, id := range sm.Replicas {
			if v.failed(id) {
				return 0
			}
		}
		return 1
	}
	slices.SortStableFunc(shards, func(a, b *shardpb.ShardMap) int { return cmp.Compare(hurt(a), hurt(b)) })

	// Repairs and rebalancing have a budget of MaxMoves shards gaining a
	// replica each, so rebalancing moves under way never hold back a repair.
	sc.mu.Lock()
	adding := [2]int{}
	for _, sm := range cm.Shards {
		if sm.Adding != "" || sc.inflight[meta.ShardMapKey(sm)] {
			adding[hurt(sm)]++
		}
	}
	sc.mu.Unlock()
	reorders := 0
	chain := map[string]bool{}
	for _, t := range cm.Tables {
		chain[t.Name] = api.IsChain(t)
	}
	for _, sm := range shards {
		key := meta.ShardMapKey(sm)
		tp := res.Placement[sm.Table]
		if tp == nil || int(sm.Shard) >= len(tp) {
			continue
		}
		target := tp[sm.Shard]
		sc.mu.Lock()
		busy := sc.inflight[key]
		unformed := sm.Epoch == 1 && !sc.formed[key]
		stuck := sm.Adding != "" && sc.failures[key+" "+sm.Adding] >= maxAddFailures
		sc.mu.Unlock()
		if busy {
			continue
		}
		if chain[sm.Table] {
			// No group to form: every member starts empty at epoch 1.
			sc.chainRound(ctx, sm, target, v, &adding[hurt(sm)])
			continue
		}
		if unformed {
			sc.start(ctx, sm, "form", func(ctx context.Context) error { return sc.checkFormed(ctx, sm) })
			continue
		}
		if rm := sc.setAsideReplica(sm, v.now); rm != "" {
			sc.start(ctx, sm, "remove-set-aside", func(ctx context.Context) error { return sc.removeSetAside(ctx, sm, rm) })
			continue
		}
		switch {
		case sm.Adding != "":
			if v.failed(sm.Adding) || !slices.Contains(target, sm.Adding) || stuck {
				if stuck {
					sc.mu.Lock()
					sc.cooldown[sm.Adding] = v.now.Add(addCooldown)
					delete(sc.failures, key+" "+sm.Adding)
					sc.mu.Unlock()
					n.log.Warn("adding a replica keeps failing; giving up on the node for a while", "group", key, "node", sm.Adding, "cooldown", addCooldown)
				}
				sc.start(ctx, sm, "abort-add", func(ctx context.Context) error { return sc.abortAdd(ctx, sm) })
			} else {
				sc.start(ctx, sm, "finish-add", func(ctx context.Context) error { return sc.finishAdd(ctx, sm) })
			}
		case len(sm.Replicas) > len(target) || hasFailedExtra(sm, target, v):
			rm := sc.pickRemoval(sm, target, v)
			if rm == "" {
				continue
			}
			sc.start(ctx, sm, "remove", func(ctx context.Context) error { return sc.remove(ctx, sm, rm) })
		default:
			add := ""
			for _, id := range target {
				if !slices.Contains(sm.Replicas, id) {
					add = id
					break
				}
			}
			if add != "" {
				sc.mu.Lock()
				cooling := v.now.Before(sc.cooldown[add])
				sc.mu.Unlock()
				kind := hurt(sm)
				if adding[kind] >= n.cfg.MaxMoves || !v.alive(add) || cooling {
					continue
				}
				adding[kind]++
				sc.start(ctx, sm, "add", func(ctx context.Context) error { return sc.beginAdd(ctx, sm, add) })
				continue
			}
			if !slices.Equal(sm.Replicas, target) && reorders < n.cfg.MaxMoves {
				reorders++
				sc.start(ctx, sm, "reorder", func(ctx context.Context) error {
					_, err := sc.setShard(sm, target, "")
					return err
				})
			}
		}
	}
}

// hasFailedExtra: the set holds a failed node that the target no longer
// has, and removing it leaves at least the target's number of replicas.
func hasFailedExtra(sm *shardpb.ShardMap, target []string, v *view) bool {
	if len(sm.Replicas) <= 1 {
		return false
	}
	for _, id := range sm.Replicas {
		if !slices.Contains(target, id) && v.failed(id) && len(sm.Replicas)-1 >= len(target) {
			return true
		}
	}
	return false
}

// pickRemoval chooses the replica to remove: one not in the target, failed
// ones first, then ones not alive.
func (sc *scheduler) pickRemoval(sm *shardpb.ShardMap, target []string, v *view) string {
	best, bestRank := "", 3
	for _, id := range sm.Replicas {
		if slices.Contains(target, id) {
			continue
		}
		rank := 2
		switch {
		case v.failed(id):
			rank = 0
		case !v.alive(id):
			rank = 1
		}
		if rank < bestRank {
			best, bestRank = id, rank
		}
	}
	return best
}

// start runs one step of one shard in its own goroutine, if the shard's
// entry is still the one the step was decided from: a round reads the map
// once, and a step of an earlier round may have changed the entry since.
func (sc *scheduler) start(ctx context.Context, sm *shardpb.ShardMap, kind string, step func(ctx context.Context) error) {
	key := meta.ShardMapKey(sm)
	sc.mu.Lock()
	sc.inflight[key] = true
	sc.mu.Unlock()
	sc.n.wg.Go(func() {
		defer func() {
			sc.mu.Lock()
			delete(sc.inflight, key)
			sc.mu.Unlock()
		}()
		if cur := sc.n.metaFSM.ShardMap(sm.Table, sm.Shard); cur == nil || cur.Epoch != sm.Epoch {
			return
		}
		ctx, cancel := context.WithTimeout(ctx, moveTimeout)
		defer cancel()
		err := step(ctx)
		sc.n.metrics.Step(kind, err)
		if sm.Adding != "" {
			sc.mu.Lock()
			if err != nil && ctx.Err() == nil && !errors.Is(err, api.ErrEpochChanged) {
				sc.failures[key+" "+sm.Adding]++
			} else if err == nil {
				delete(sc.failures, key+" "+sm.Adding)
			}
			sc.mu.Unlock()
		}
		if err != nil && ctx.Err() == nil {
			lvl := sc.n.log.Warn
			if errors.Is(err, api.ErrEpochChanged) {
				lvl = sc.n.log.Debug
			}
			lvl("placement step failed; retrying next round", "group", key, "error", err)
		}
	})
}

// setShard commits a shard's new entry, if sm is still current.
func (sc *scheduler) setShard(sm *shardpb.ShardMap, replicas []string, adding string) (*shardpb.ShardMap, error) {
	out, err := sc.n.applyMeta(meta.CmdSetShard, &shardpb.MetaSetShard{
		Table: sm.Table, Shard: sm.Shard, ExpectEpoch: sm.Epoch, Replicas: replicas, Adding: adding,
	}, fmt.Sprintf("changing shard %s", meta.ShardMapKey(sm)))
	if err != nil {
		return nil, err
	}
	nsm, _ := out.(*shardpb.ShardMap)
	sc.n.log.Info("shard map changed", "group", meta.ShardMapKey(sm), "epoch", nsm.GetEpoch(), "replicas", replicas, "adding", adding)
	return nsm, nil
}

// checkFormed marks an epoch-1 shard formed once its group has a leader.
func (sc *scheduler) checkFormed(ctx context.Context, sm *shardpb.ShardMap) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	resp, err := sc.n.callShardLeader(ctx, sm, &shardpb.ReconfigureRequest{Table: sm.Table, Shard: sm.Shard, Op: shardpb.ReconfigureOp_RECONFIGURE_QUERY})
	if err != nil || resp.LeaderAddr == "" {
		return nil // not yet: the next round asks again
	}
	sc.mu.Lock()
	sc.formed[meta.ShardMapKey(sm)] = true
	sc.mu.Unlock()
	return nil
}

func (sc *scheduler) beginAdd(ctx context.Context, sm *shardpb.ShardMap, add string) error {
	nsm, err := sc.setShard(sm, sm.Replicas, add)
	if err != nil {
		return err
	}
	return sc.finishAdd(ctx, nsm)
}

func (sc *scheduler) finishAdd(ctx context.Context, sm *shardpb.ShardMap) error {
	nd := sc.n.metaFSM.Node(sm.Adding)
	if nd == nil {
		return fmt.Errorf("node %q: %w", sm.Adding, api.ErrUnknownNode)
	}
	start := time.Now()
	if _, err := sc.n.callShardLeader(ctx, sm, &shardpb.ReconfigureRequest{
		Table: sm.Table, Shard: sm.Shard, Op: shardpb.ReconfigureOp_RECONFIGURE_ADD, NodeId: nd.Id, NodeAddr: nd.PeerAddr, Epoch: sm.Epoch,
	}); err != nil {
		return err
	}
	sc.n.log.Info("replica added", "group", meta.ShardMapKey(sm), "node", nd.Id, "took", time.Since(start))
	_, err := sc.setShard(sm, append(slices.Clone(sm.Replicas), sm.Adding), "")
	return err
}

func (sc *scheduler) abortAdd(ctx context.Context, sm *shardpb.ShardMap) error {
	if _, err := sc.n.callShardLeader(ctx, sm, &shardpb.ReconfigureRequest{
		Table: sm.Table, Shard: sm.Shard, Op: shardpb.ReconfigureOp_RECONFIGURE_REMOVE, NodeId: sm.Adding, Epoch: sm.Epoch,
	}); err != nil {
		return err
	}
	_, err := sc.setShard(sm, sm.Replicas, "")
	return err
}

func (sc *scheduler) remove(ctx context.Context, sm *shardpb.ShardMap, rm string) error {
	if _, err := sc.n.callShardLeader(ctx, sm, &shardpb.ReconfigureRequest{
		Table: sm.Table, Shard: sm.Shard, Op: shardpb.ReconfigureOp_RECONFIGURE_REMOVE, NodeId: rm, Epoch: sm.Epoch,
	}); err != nil {
		return err
	}
	rest := slices.DeleteFunc(slices.Clone(sm.Replicas), func(id string) bool { return id == rm })
	_, err := sc.setShard(sm, rest, "")
	return err
}

// setAsideReplica returns a replica of sm's Raft group whose node reported
// it set aside (setaside.go) at sm's epoch, or "". Not while a replica is
// being added: that step finishes first, and the node reports again at the
// new epoch.
func (sc *scheduler) setAsideReplica(sm *shardpb.ShardMap, now time.Time) string {
	if sm.Adding != "" {
		return ""
	}
	for _, id := range sm.Replicas {
		if r, ok := sc.n.broken.get(meta.ShardMapKey(sm), id, now); ok && r.setAside && r.epoch == sm.Epoch {
			return id
		}
	}
	return ""
}

// removeSetAside removes a replica whose node set its files aside from the
// group, which the other replicas commit (the empty replica never votes:
// its node does not open it while the map lists it). The group runs one
// replica short until the scheduler adds one back, on that node if the
// placement keeps it there, as a repair: a non-voter that catches up first.
func (sc *scheduler) removeSetAside(ctx context.Context, sm *shardpb.ShardMap, rm string) error {
	if err := sc.remove(ctx, sm, rm); err != nil {
		return err
	}
	sc.n.broken.forget(meta.ShardMapKey(sm), rm)
	sc.n.log.Info("set-aside replica removed from its group; it is rebuilt as a repair", "group", meta.ShardMapKey(sm), "node", rm)
	return nil
}

// callShardLeader sends req to the leader of sm's group, trying its
// replicas in map order and following NotLeader hints, until it succeeds or
// ctx ends. Errors other than "ask someone else" end it at once.
func (n *Node) callShardLeader(ctx context.Context, sm *shardpb.ShardMap, req *shardpb.ReconfigureRequest) (*shardpb.ReconfigureResponse, error) {
	var addrs []string
	for _, id := range sm.Replicas {
		if nd := n.metaFSM.Node(id); nd != nil {
			addrs = append(addrs, nd.PeerAddr)
		}
	}
	backoff := 20 * time.Millisecond
	var last error
	for {
		for _, addr := range addrs {
			resp, err := n.callReconfigure(ctx, addr, req)
			if err == nil {
				return resp, nil
			}
			last = err
			// A refusal names the leader by ID (and by its client
			// address, which is not where peers call).
			var re *api.RemoteError
			if errors.As(err, &re) && re.LeaderID != "" {
				if nd := n.metaFSM.Node(re.LeaderID); nd != nil && nd.PeerAddr != addr {
					if resp, err = n.callReconfigure(ctx, nd.PeerAddr, req); err == nil {
						return resp, nil
					}
					last = err
				}
			}
			if !api.Retryable(err) && !errors.Is(err, api.ErrNotReplica) {
				return nil, err
			}
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("group %s: %s: %w (last error: %v)", meta.ShardMapKey(sm), req.Op, ctx.Err(), last)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
	}
}

func (n *Node) callReconfigure(ctx context.Context, addr string, req *shardpb.ReconfigureRequest) (*shardpb.ReconfigureResponse, error) {
	if addr == n.cfg.PeerAddr {
		resp, err := (&peerService{n: n}).Reconfigure(ctx, req)
		if err != nil {
			return nil, fromStatus(err)
		}
		return resp, nil
	}
	ps, err := n.peerStub(addr)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", api.ErrUnavailable, err)
	}
	resp, err := ps.Reconfigure(ctx, req)
	if err != nil {
		err = fromStatus(err)
		if !errors.Is(err, api.ErrUnavailable) && ctx.Err() == nil {
			var re *api.RemoteError
			if !errors.As(err, &re) {
				err = fmt.Errorf("%w: %v", api.ErrUnavailable, err)
			}
		}
	}
	return resp, err
}

// metaChanges makes this round's metadata group and node changes, from a
// map and gossip view of its own.
func (sc *scheduler) metaChanges() {
	cm := sc.n.metaFSM.ClusterMap()
	v := sc.newView(cm)
	sc.metaVoters(v)
	sc.forgetRemoved(cm, v)
}

// forgetRemoved deletes removed nodes that hold no replica any more.
func (sc *scheduler) forgetRemoved(cm *shardpb.ClusterMap, v *view) {
	for _, nd := range cm.Nodes {
		if nd.Admin != shardpb.NodeAdmin_NODE_REMOVED {
			continue
		}
		holds := false
		for _, sm := range cm.Shards {
			if slices.Contains(sm.Replicas, nd.Id) || sm.Adding == nd.Id {
				holds = true
				break
			}
		}
		if holds {
			continue
		}
		// Out of the metadata group first, then out of the map.
		r := sc.n.meta.Raft
		if err := r.RemoveServer(raft.ServerID(nd.Id), 0, configChangeTimeout).Error(); err != nil {
			sc.n.log.Warn("removing a removed node from the metadata group", "node", nd.Id, "error", err)
			continue
		}
		if _, err := sc.n.applyMeta(meta.CmdForgetNode, &shardpb.SetNodeAdminRequest{Id: nd.Id}, "forgetting node "+nd.Id); err != nil {
			sc.n.log.Warn("forgetting a removed node", "node", nd.Id, "error", err)
			continue
		}
		sc.n.log.Info("removed node forgotten", "node", nd.Id)
	}
}

// metaVoters keeps the metadata group at 3 voters (5 from 5 eligible nodes
// on), one configuration change per round: it promotes live active
// non-voters, removes failed members, and demotes draining voters once
// enough others vote.
func (sc *scheduler) metaVoters(v *view) {
	n := sc.n
	r := n.meta.Raft
	f := r.GetConfiguration()
	if f.Error() != nil {
		return
	}
	var voters, nonvoters []string
	for _, srv := range f.Configuration().Servers {
		if srv.Suffrage == raft.Voter {
			voters = append(voters, string(srv.ID))
		} else {
			nonvoters = append(nonvoters, string(srv.ID))
		}
	}
	// The number of voters follows the placeable nodes (active, not
	// failed), not the ones alive this instant: a node that misses a few
	// probes under load must not make the group demote and promote in turn.
	// Only a promotion needs the node alive now.
	count := 0
	for _, nd := range v.nodes {
		if v.placeable(nd.Id) {
			count++
		}
	}
	desired := 5
	switch {
	case count < 3:
		desired = max(1, len(voters)) // too few to choose: keep what there is
	case count < 5:
		desired = 3
	}
	good := 0
	for _, id := range voters {
		if v.placeable(id) {
			good++
		}
	}
	change := func(what, id string, fut raft.IndexFuture) {
		if err := fut.Error(); err != nil {
			n.log.Warn("metadata group change", "change", what, "node", id, "error", err)
			return
		}
		n.log.Info("metadata group changed", "change", what, "node", id)
	}
	// Registered nodes the group lacks (a leader change between the
	// registration and its AddNonvoter) join as non-voters.
	for _, nd := range v.nodes {
		if nd.Admin == shardpb.NodeAdmin_NODE_ACTIVE && v.alive(nd.Id) && !slices.Contains(voters, nd.Id) && !slices.Contains(nonvoters, nd.Id) {
			change("add non-voter", nd.Id, r.AddNonvoter(raft.ServerID(nd.Id), raft.ServerAddress(nd.PeerAddr), 0, configChangeTimeout))
			return
		}
	}
	if good < desired {
		for _, id := range nonvoters {
			if v.placeable(id) && v.alive(id) {
				change("promote", id, r.AddVoter(raft.ServerID(id), raft.ServerAddress(v.nodes[id].PeerAddr), 0, configChangeTimeout))
				return
			}
		}
	}
	for _, id := range append(slices.Clone(voters), nonvoters...) {
		if id != n.cfg.ID && v.nodes[id] != nil && v.failed(id) {
			change("remove failed", id, r.RemoveServer(raft.ServerID(id), 0, configChangeTimeout))
			return
		}
	}
	for _, id := range voters {
		if good >= desired && v.nodes[id] != nil && v.nodes[id].Admin != shardpb.NodeAdmin_NODE_ACTIVE {
			if id == n.cfg.ID {
				change("hand over leadership (draining)", id, leadershipFuture{n.meta.TransferLeadership("", ""), r})
				return
			}
			change("demote draining", id, r.DemoteVoter(raft.ServerID(id), 0, configChangeTimeout))
			return
		}
	}
	if good > desired {
		// A surplus voter: one not alive now if any, else any but this one.
		pick := ""
		for _, id := range voters {
			if id != n.cfg.ID && v.placeable(id) && (pick == "" || !v.alive(id)) {
				pick = id
			}
		}
		if pick != "" {
			change("demote surplus", pick, r.DemoteVoter(raft.ServerID(pick), 0, configChangeTimeout))
		}
	}
}

// leadershipFuture adapts a leadership transfer's Future to the IndexFuture
// change() takes; its Error is replication.Await's.
type leadershipFuture struct {
	raft.Future
	r *raft.Raft
}

func (f leadershipFuture) Error() error { return replication.Await(f.r, f.Future) }
func (leadershipFuture) Index() uint64  { return 0 }
