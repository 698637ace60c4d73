package shard

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/raftps/raftps/shard/api"
	"github.com/raftps/raftps/shard/meta"

	"github.com/hashicorp/raft"
	"github.com/raftps/raftps/replication"
	"github.com/raftps/raftps/replication/chain"
	"github.com/raftps/raftps/shard/shardpb"
	"github.com/raftps/raftps/store"
)

// A node's chain replicas: what reconcile, the handlers and Status do for
// shards of chain tables (see chainsched.go for how the map orders them).
//
// Identity: a Chain knows its members by gRPC address (ChainConfig.NodeAddr,
// the node's Addr), so the order handed to SetConfig is the map's replica
// IDs translated to addresses; a node's address cannot change while it holds
// a replica (applyRegister refuses it).

// Chain returns this node's replica of a chain shard, if it has one.
func (n *Node) Chain(table string, shard uint32) *chain.Chain {
	n.mu.RLock()
	defer n.mu.RUnlock()
	return n.chains[api.GroupID(table, shard)]
}

// chainDir is where a chain replica keeps its log and snapshots: apart from
// Raft groups' directories, which findRetired and gcRetired manage.
// reconcileChain and gcLeftChains delete chain replicas.
func (n *Node) chainDir(id string) string { return filepath.Join(n.cfg.DataDir, "chains", id) }

// findLeftChains marks every chain replica on disk, at start, for
// gcLeftChains to look at: replicas the node kept when a short chain
// dropped it (reconcileChain) and replicas of chains that went on without
// it while it was down, whose removal its restored map may already show, so
// that reconcileChain never opens (and so never deletes) them. The map a
// node starts with may be older or newer than such a removal, so it decides
// nothing here: replicas the map still gives this node are opened by
// reconcileChain and dropped from the set.
func (n *Node) findLeftChains() {
	for table, sh := range replicaDirs(filepath.Join(n.cfg.DataDir, "chains")) {
		n.leftChains[api.GroupID(table, sh)] = time.Time{}
	}
}

// gcLeftChains deletes the left-behind chain replicas (findLeftChains,
// reconcileChain) that the metadata leader confirms this node is no member
// of and will not be appended to again: the leader answers with each
// chain's current epoch (metaReadIndex), and a replica is deleted once this
// node's map holds that very epoch, without this node, and with a full
// chain (the table's replica count). A short chain keeps the replica: the
// scheduler appends a node restarted within the repair grace again, and a
// replica it still holds catches up from its predecessor's log instead of
// receiving the whole shard again. A member's data is never needed after
// its removal, so a deletion is safe even if the map appends the node right
// after the answer: reconcileChain, which runs in the same loop, then opens
// the replica anew and its predecessor catches it up from scratch. A chain
// the leader does not know is kept (it is not this cluster's to delete) and
// no longer asked about.
func (n *Node) gcLeftChains() {
	now := time.Now()
	var ids []string
	for _, id := range slices.Sorted(maps.Keys(n.leftChains)) {
		if n.chainOpen(id) {
			delete(n.leftChains, id) // reopened: reconcileChain owns it again
			continue
		}
		if len(ids) < gcPerTick && !now.Before(n.leftChains[id]) {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		return
	}
	epochs, err := n.chainEpochs(slices.Clone(ids))
	if err != nil {
		n.log.Debug("cannot confirm left-behind chain replicas yet", "groups", ids, "error", err)
		return
	}
	for _, id := range ids {
		e := epochs[id]
		sm := n.metaFSM.ShardMapByID(id)
		var spec *shardpb.TableSpec
		if sm != nil {
			spec = n.metaFSM.Table(sm.Table)
		}
		switch {
		case e == 0:
			n.log.Warn("keeping a chain replica on disk that the metadata leader does not know", "group", id, "dir", n.chainDir(id))
			delete(n.leftChains, id)
		case sm == nil || sm.Epoch != e || spec == nil:
			// This node's map has not caught up with the leader's answer
			// (or moved past it): ask again next pass.
		case isReplica(sm, n.cfg.ID):
			delete(n.leftChains, id) // still or again a member: reconcileChain opens it
		case chainShort(sm, spec):
			n.leftChains[id] = now.Add(leftChainRecheck) // may be appended again
		default:
			if err := n.removeReplicaDir(n.chainDir(id)); err != nil {
				n.log.Warn("deleting a left-behind chain replica", "group", id, "error", err)
				continue
			}
			delete(n.leftChains, id)
			os.Remove(filepath.Dir(n.chainDir(id))) // the table's directory, if that was its last shard here
			n.log.Info("left-behind chain replica deleted: the chain went on without this node while it was down", "group", id, "epoch", e, "chain", sm.Replicas)
		}
	}
}

// chainShort reports whether the chain sm is short of its table's replica
// count: the scheduler will append a node to it, likely one it removed.
func chainShort(sm *shardpb.ShardMap, spec *shardpb.TableSpec) bool {
	return len(sm.Replicas) < int(spec.Replicas)
}

// leftChainRecheck is how long gcLeftChains waits before asking again
// about a left-behind replica of a chain that is one member short.
const leftChainRecheck = 5 * time.Second

func (n *Node) chainOpen(id string) bool {
	n.mu.RLock()
	defer n.mu.RUnlock()
	return n.chains[id] != nil
}

// chainOrder is sm's replica list as addresses, or false if the map lacks
// one's address.
func chainOrder(sm *shardpb.ShardMap, addrOf map[string]string) ([]string, bool) {
	out := make([]string, 0, len(sm.Replicas))
	for _, id := range sm.Replicas {
		a := addrOf[id]
		if a == "" {
			return nil, false
		}
		out = append(out, a)
	}
	return out, true
}

// reconcileChain opens, configures and closes this node's replica of a
// chain shard to match its map entry.
//
// A replica the map no longer places here is closed at once. Its data is
// deleted with it if the replica is broken or the chain went on without
// this node (it has the table's replica count), since a member's data is
// never needed after its removal. Otherwise (the chain is short: this node
// was removed while down, paused or cut off) the data stays on disk for
// gcLeftChains to decide: the scheduler will likely append this node again,
// and its predecessor then sends only what the replica lacks instead of
// the whole shard again (its snapshot or its whole log). A node restarted
// after its removal opens its replica under its restored map and closes it
// again once the map catches up, so this is the common case.
func (n *Node) reconcileChain(sm *shardpb.ShardMap, spec *shardpb.TableSpec, addrOf map[string]string) {
	id := meta.ShardMapKey(sm)
	member := isReplica(sm, n.cfg.ID)
	ch := n.Chain(sm.Table, sm.Shard)
	if n.setAside.blocked(id, member) {
		return // set aside: not reopened until the map removes this node (setaside.go)
	}
	switch {
	case member && ch == nil:
		delete(n.leftChains, id)
		cfg, err := api.TableConfig(spec)
		if err != nil {
			n.log.Error("table spec in metadata is invalid", "table", spec.Name, "error", err)
			return
		}
		if err := n.prepareReplicaDir(n.chainDir(id), sm.Incarnation); err != nil {
			n.log.Error("preparing chain replica directory", "group", id, "error", err)
			return
		}
		if ch, err = n.openChain(id, cfg); err != nil {
			if !n.openFailed(id, n.chainDir(id), true, err) {
				n.log.Error("opening chain replica", "group", id, "error", err)
			}
			return
		}
		n.log.Info("chain replica opened", "group", id, "epoch", sm.Epoch)
	case !member && ch != nil:
		if ch.Err() == nil && chainShort(sm, spec) {
			n.closeChain(id, false)
			n.leftChains[id] = time.Now().Add(leftChainRecheck)
			n.log.Info("chain replica closed and kept on disk: the map removed this node from a chain that is short, which may append it again", "group", id, "epoch", sm.Epoch)
			return
		}
		n.closeChain(id, true)
		n.log.Info("chain replica closed and deleted: the map moved it away", "group", id, "epoch", sm.Epoch)
		return
	case !member:
		return
	}
	if ch.Epoch() >= sm.Epoch {
		return // configured already, or this node's map lags the chain's
	}
	order, ok := chainOrder(sm, addrOf)
	if !ok {
		return
	}
	if err := ch.SetConfig(sm.Epoch, order); err != nil {
		n.log.Warn("configuring chain replica", "group", id, "epoch", sm.Epoch, "order", order, "error", err)
	}
}

func (n *Node) openChain(id string, cfg store.TableConfig) (*chain.Chain, error) {
	ch, err := chain.Open(chain.Config{
		ID: id, NodeAddr: n.cfg.PeerAddr, Dir: n.chainDir(id), Table: cfg, Mux: n.chainMux,
		Space: n.disk, Logger: n.log.Named(id), Metrics: n.groupMetrics(id),
	})
	if err != nil {
		return nil, err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	select {
	case <-n.closed:
		ch.Close()
		return nil, errors.New("node closed")
	default:
	}
	n.chains[id] = ch
	return ch, nil
}

// closeChain closes this node's replica of a chain, deleting its data if
// asked.
func (n *Node) closeChain(id string, remove bool) {
	n.mu.Lock()
	ch := n.chains[id]
	delete(n.chains, id)
	n.mu.Unlock()
	if ch == nil {
		return
	}
	if err := ch.Close(); err != nil {
		n.log.Warn("closing chain replica", "group", id, "error", err)
	}
	n.metrics.Replication.Forget(id)
	if remove {
		if err := n.removeReplicaDir(n.chainDir(id)); err != nil {
			n.log.Warn("deleting a moved-away chain replica", "group", id, "error", err)
		}
	}
}

// chainFor finds this node's replica of a chain shard for a request carrying
// the client's map epoch (the same epoch rules as groupFor).
func (n *Node) chainFor(spec *shardpb.TableSpec, shard uint32, epoch uint64) (*chain.Chain, error) {
	if err := n.checkShardEpoch(spec, shard, epoch); err != nil {
		return nil, err
	}
	ch := n.Chain(spec.Name, shard)
	if ch == nil {
		return nil, fmt.Errorf("chain %s: %w: replica not open on node %s yet", api.GroupID(spec.Name, shard), api.ErrUnavailable, n.cfg.ID)
	}
	// A replica whose configuration is older than what the client or this
	// node's map knows (a node just restarted from disk, or a map change
	// reconcile has not handed it yet) may believe itself head or tail of
	// an order that is gone: it must not serve until SetConfig catches up.
	// The client asks another member meanwhile.
	newest := epoch
	if sm := n.metaFSM.ShardMap(spec.Name, shard); sm != nil {
		newest = max(newest, sm.Epoch)
	}
	if have := ch.Epoch(); newest > have {
		n.kickReconcile()
		return nil, fmt.Errorf("chain %s: %w: node %s has the chain's epoch %d, the shard map %d", ch.ID(), chain.ErrEpochAhead, n.cfg.ID, have, newest)
	}
	return ch, nil
}

// chainPush hands a push to the chain; only the head takes it. A member
// that is not the head answers ErrNotHead with the head it knows, which
// toStatus sends as a NotLeader detail: the client follows it exactly as it
// follows a Raft follower's hint.
func (s *service) chainPush(ctx context.Context, spec *shardpb.TableSpec, req *shardpb.PushRequest, keys []uint64, grads []float32) (*shardpb.PushResponse, error) {
	ch, err := s.n.chainFor(spec, req.Shard, req.Epoch)
	if err != nil {
		return nil, s.n.toStatus(err)
	}
	if ch.Role() == chain.RoleHead {
		if err := s.n.disk.Check(); err != nil {
			return nil, s.n.toStatus(err)
		}
	}
	dup, err := ch.Push(ctx, &replication.Push{Client: req.ClientId, Seq: req.Seq, Keys: keys, Grads: grads, BF16: api.IsBF16(spec)})
	if err != nil {
		return nil, s.n.toStatus(err)
	}
	return &shardpb.PushResponse{Duplicate: dup}, nil
}

// chainPull serves a pull of a chain shard at level, on any member:
//
//   - linearizable: the member confirms with the metadata leader that its
//     epoch is current (chainconfirm.go), then ReadCRAQ. A clean key's value
//     is that of its newest committed entry (chain.Chain.Pull argues
//     why), and a dirty key is read at the tail, so every read sees every
//     push acknowledged before it began and nothing a later read could
//     miss: linearizable.
//   - bounded(δ): ReadCRAQ after an epoch confirmation sent less than δ
//     ago, which most reads find already made: the member held every push
//     acknowledged before that confirmation was sent.
//   - eventual: ReadAny, what this member has applied. A member serves only
//     while it is in the order of its current epoch, and a removed member is
//     told so by its next SetConfig, so a replica cut off from its chain for
//     good stops serving; one lagging behind its predecessor only while the
//     stream delivers.
//
// Errors other than a bad request are retryable (reads change nothing): the
// tail a CRAQ read asked may have just been replaced.
func (s *service) chainPull(ctx context.Context, spec *shardpb.TableSpec, req *shardpb.PullRequest, keys []uint64, level shardpb.Consistency, bound time.Duration) (*shardpb.PullResponse, error) {
	ch, err := s.n.chainFor(spec, req.Shard, req.Epoch)
	if err != nil {
		return nil, s.n.toStatus(err)
	}
	role := roleFollower
	if ch.Role() == chain.RoleTail {
		role = roleLeader // the tail answers from its own state, as a leader does
	}
	out := make([]float32, len(keys)*int(spec.Dim))
	ix, err := s.n.chainRead(ctx, ch, keys, out, level, bound)
	if err != nil {
		s.n.served.refused(role, level)
		return nil, s.n.toStatus(err)
	}
	s.n.served.served(role, level, len(keys))
	s.n.countHot(spec, req.Shard, keys)
	return &shardpb.PullResponse{Values: api.ValuesBytes(out), AppliedIndex: ix, ServedBy: roleNames[role]}, nil
}

// chainRead reads keys' rows from this chain member into out at level:
// eventual from its own state; bounded and linearizable by CRAQ once the
// member has confirmed its epoch with the metadata leader (within bound,
// or now). It returns the applied index the rows are at.
func (n *Node) chainRead(ctx context.Context, ch *chain.Chain, keys []uint64, out []float32, level shardpb.Consistency, bound time.Duration) (uint64, error) {
	mode := chain.ReadCRAQ
	var err error
	switch level {
	case shardpb.Consistency_CONSISTENCY_EVENTUAL:
		mode = chain.ReadAny
	case shardpb.Consistency_CONSISTENCY_BOUNDED:
		err = n.confirmer.confirm(ctx, ch.ID(), ch.Epoch(), bound)
	default:
		err = n.confirmer.confirm(ctx, ch.ID(), ch.Epoch(), 0)
	}
	if err != nil {
		return 0, err
	}
	ix, err := ch.Pull(ctx, keys, out, mode)
	if err != nil {
		if !errors.Is(err, replication.ErrBadRequest) && !errors.Is(err, store.ErrDimMismatch) && ctx.Err() == nil {
			err = fmt.Errorf("%w: %w", api.ErrUnavailable, err)
		}
		return 0, err
	}
	return ix, nil
}

// chainStatus is a chain replica's status line. State says "leader" on the
// head and "follower" elsewhere, so that tools reading Raft groups' status
// (raftps chaos waits for each group's leader's applied index) read chains
// alike; ChainRole has the real role.
func chainStatus(ch *chain.Chain, table string, shard uint32, cm *shardpb.ClusterMap) *shardpb.ReplicaStatus {
	idOf, clientOf := map[string]string{}, map[string]string{} // by peer address
	for _, nd := range cm.Nodes {
		idOf[nd.PeerAddr], clientOf[nd.PeerAddr] = nd.Id, nd.Addr
	}
	order := ch.Order()
	ids := make([]string, len(order))
	for i, a := range order {
		ids[i] = cmp.Or(idOf[a], a)
	}
	role := ch.Role()
	rs := &shardpb.ReplicaStatus{
		Group: ch.ID(), Table: table, Shard: shard, State: "follower",
		Replication: api.ReplicationChain, ChainRole: role.String(), ChainEpoch: ch.Epoch(), ChainOrder: ids,
		AppliedIndex: ch.AppliedIndex(), CommitIndex: ch.CommittedIndex(), Term: ch.Epoch(),
		ChainCaughtUp: ch.CaughtUp(),
	}
	if role == chain.RoleHead {
		rs.State = "leader"
	}
	if len(order) > 0 {
		rs.LeaderAddr, rs.LeaderId = clientOf[order[0]], ids[0]
	}
	rs.LastIndex = rs.AppliedIndex
	t := ch.Table()
	rs.Rows, rs.MemoryBytes = uint64(t.Len()), uint64(t.MemoryBytes())
	return rs
}

// waitChainReady waits until every member of every shard of a chain table
// has its replica open in the shard's current epoch, asking each member's
// status: then a push reaches a head that can forward it.
func (n *Node) waitChainReady(ctx context.Context, spec *shardpb.TableSpec) error {
	err := pollUntil(ctx, 20*time.Millisecond, func() (bool, error) {
		cm := n.metaFSM.ClusterMap()
		addrOf := peerAddrs(cm)
		want := map[string]map[string]uint64{} // node address -> group -> epoch
		for s := range spec.Shards {
			sm := n.metaFSM.ShardMap(spec.Name, s)
			if sm == nil {
				return false, nil
			}
			for _, id := range sm.Replicas {
				a := addrOf[id]
				if want[a] == nil {
					want[a] = map[string]uint64{}
				}
				want[a][meta.ShardMapKey(sm)] = sm.Epoch
			}
		}
		for _, a := range slices.Sorted(maps.Keys(want)) {
			qctx, cancel := context.WithTimeout(ctx, time.Second)
			st, err := n.statusOf(qctx, a)
			cancel()
			if err != nil {
				return false, nil
			}
			for _, rs := range st.Replicas {
				if e, ok := want[a][rs.Group]; ok && rs.Replication == api.ReplicationChain && rs.ChainEpoch >= e {
					delete(want[a], rs.Group)
				}
			}
			if len(want[a]) > 0 {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("table %q: %w: its chains are not all configured: %w", spec.Name, api.ErrUnavailable, err)
	}
	return nil
}

// statusOf is the status of the node at peer address addr (this node's
// without a call).
func (n *Node) statusOf(ctx context.Context, addr string) (*shardpb.StatusResponse, error) {
	if addr == n.cfg.PeerAddr {
		return (&service{n: n}).Status(ctx, &shardpb.StatusRequest{})
	}
	ps, err := n.peerStub(addr)
	if err != nil {
		return nil, err
	}
	return ps.Status(ctx, &shardpb.StatusRequest{})
}

// Broken chain replicas.
//
// A replica whose disk failed (chain.ErrReplicaBroken) stops, but its
// node lives on: gossip and the metadata leader's silence check see nothing
// wrong, and the chain would stall for good. So the node reports each such
// replica to the metadata leader every reconcile round while the map still
// lists it there (reportBrokenChains); the leader keeps the reports in
// memory for brokenReportTTL (a new leader hears them again within a round)
// and its scheduler removes the member (chainDead) and gives the node no new
// replica for addCooldown.

// brokenReportTTL is how long a report counts without being repeated.
const brokenReportTTL = 3 * reconcileInterval

// brokenReports is the metadata leader's record of broken chain replicas
// and of set-aside replicas (setaside.go) of either kind.
// Concurrency: mu guards at.
type brokenReports struct {
	mu sync.Mutex
	at map[string]brokenReport // "group\x00node" -> last report
}

// brokenReport is the last report of one replica: when, the shard's map
// epoch the node had, and whether its files were set aside (rather than
// its disk failing under it).
type brokenReport struct {
	at       time.Time
	epoch    uint64
	setAside bool
}

func (b *brokenReports) add(group, node string, r brokenReport) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.at == nil {
		b.at = map[string]brokenReport{}
	}
	b.at[group+"\x00"+node] = r
}

// get returns node's report of its replica of group if it is less than
// brokenReportTTL older than now, and forgets stale reports.
func (b *brokenReports) get(group, node string, now time.Time) (brokenReport, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	k := group + "\x00" + node
	r, ok := b.at[k]
	if ok && now.Sub(r.at) > brokenReportTTL {
		delete(b.at, k)
		return brokenReport{}, false
	}
	return r, ok
}

// has reports whether node reported its replica of group broken less than
// brokenReportTTL before now.
func (b *brokenReports) has(group, node string, now time.Time) bool {
	_, ok := b.get(group, node, now)
	return ok
}

// forget drops node's report about group: the scheduler acted on it.
func (b *brokenReports) forget(group, node string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.at, group+"\x00"+node)
}

// ReportBroken records a node's report of a broken chain replica (see
// brokenReports); only the metadata leader takes it.
func (s *peerService) ReportBroken(ctx context.Context, req *shardpb.ReportBrokenRequest) (*shardpb.ReportBrokenResponse, error) {
	if req.NodeId == "" || req.Group == "" {
		return nil, s.n.toStatus(fmt.Errorf("%w: report of a broken replica needs node_id and group", api.ErrBadRequest))
	}
	if err := s.n.takeBrokenReport(req); err != nil {
		return nil, s.n.toStatus(err)
	}
	return &shardpb.ReportBrokenResponse{}, nil
}

func (n *Node) takeBrokenReport(req *shardpb.ReportBrokenRequest) error {
	if n.meta.Raft.State() != raft.Leader {
		return n.notMetaLeader()
	}
	if sm := n.metaFSM.ShardMapByID(req.Group); sm == nil || !slices.Contains(sm.Replicas, req.NodeId) {
		return nil // removed already, or never there: nothing to do
	}
	if !n.broken.has(req.Group, req.NodeId, time.Now()) {
		what := "chain replica reported broken; removing it from the chain"
		if req.SetAside {
			what = "replica reported set aside (its files failed their checks); removing it from the shard to rebuild it"
		}
		n.log.Warn(what, "group", req.Group, "node", req.NodeId, "epoch", req.Epoch, "reason", req.Reason)
	}
	n.broken.add(req.Group, req.NodeId, brokenReport{at: time.Now(), epoch: req.Epoch, setAside: req.SetAside})
	return nil
}

// reportBrokenChains reports this node's broken chain replicas that the map
// still lists here to the metadata leader.
func (n *Node) reportBrokenChains() {
	n.mu.RLock()
	var reports []*shardpb.ReportBrokenRequest
	for id, ch := range n.chains {
		if err := ch.Err(); err != nil {
			reports = append(reports, &shardpb.ReportBrokenRequest{NodeId: n.cfg.ID, Group: id, Epoch: ch.Epoch(), Reason: err.Error()})
		}
	}
	n.mu.RUnlock()
	for _, r := range reports {
		if sm := n.metaFSM.ShardMapByID(r.Group); sm == nil || !slices.Contains(sm.Replicas, n.cfg.ID) {
			continue // reconcile closes and deletes it
		}
		if err := n.sendBrokenReport(r); err != nil {
			n.log.Warn("reporting a broken chain replica to the metadata leader", "group", r.Group, "error", err)
		}
	}
}

func (n *Node) sendBrokenReport(r *shardpb.ReportBrokenRequest) error {
	return n.atMetaLeader(func() error { return n.takeBrokenReport(r) },
		func(ps shardpb.PeerClient, _ raft.ServerAddress) error {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			_, err := ps.ReportBroken(ctx, r)
			return err
		})
}
