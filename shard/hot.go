package shard

import (
	"cmp"
	"context"
	"fmt"
	"hash/fnv"
	"slices"
	"sync"
	"time"

	"github.com/raftps/raftps/shard/api"

	"github.com/raftps/raftps/replication/chain"
	"github.com/raftps/raftps/shard/shardpb"
)

// Hot keys (see docs/ARCHITECTURE.md, "Hot keys"). Every node counts the
// keys of the pulls it serves per shard in a space-saving sketch; once a
// window each node sends its counts to the shard's leader (of a chain
// table: its head), which adds them up, decides the hot set (rate at least
// the table's threshold; a hot key stays hot until its rate falls below
// half of it), and assigns read replicas on nodes outside the shard's
// replica set. A read replica copies the hot rows from the leader by
// linearizable reads (HotRows) every few tens of milliseconds and serves
// them at the bounded and eventual levels, under the same read-lease rule
// as a follower.
const (
	// HotWindow is the counting window.
	HotWindow = time.Second
	// hotSketchSize bounds the keys a node counts per shard and window; a
	// key's count is over-estimated by at most the smallest count kept.
	hotSketchSize = 64
	// MaxHotKeys bounds a shard's hot set.
	MaxHotKeys = 256
	// hotAssignTTL: a read replica drops a shard's hot rows when no leader
	// has renewed its assignment for this long (a leader renews it every
	// window).
	hotAssignTTL = 5 * HotWindow
	// hotEventualRefresh is how often a read replica refreshes the rows of a
	// table that is not bounded; eventualAbandon is how old they may be
	// before it refuses to serve them.
	hotEventualRefresh = 100 * time.Millisecond
	eventualAbandon    = 2 * time.Second
)

// spaceSaving is the space-saving top-k sketch (Metwally et al. 2005) over
// one window: at most cap keys, each with a count that over-estimates its
// true count by at most err. A min-heap on count finds the key to evict.
type spaceSaving struct {
	cap  int
	idx  map[uint64]int // key -> heap position
	heap []ssEntry
}

type ssEntry struct {
	key, count, err uint64
}

func newSpaceSaving(capacity int) *spaceSaving {
	return &spaceSaving{cap: capacity, idx: make(map[uint64]int, capacity), heap: make([]ssEntry, 0, capacity)}
}

func (s *spaceSaving) add(key, n uint64) {
	if i, ok := s.idx[key]; ok {
		s.heap[i].count += n
		s.down(i)
		return
	}
	if len(s.heap) < s.cap {
		s.heap = append(s.heap, ssEntry{key: key, count: n})
		s.idx[key] = len(s.heap) - 1
		s.up(len(s.heap) - 1)
		return
	}
	min := s.heap[0]
	delete(s.idx, min.key)
	s.heap[0] = ssEntry{key: key, count: min.count + n, err: min.count}
	s.idx[key] = 0
	s.down(0)
}

func (s *spaceSaving) less(i, j int) bool { return s.heap[i].count < s.heap[j].count }

func (s *spaceSaving) swap(i, j int) {
	s.heap[i], s.heap[j] = s.heap[j], s.heap[i]
	s.idx[s.heap[i].key], s.idx[s.heap[j].key] = i, j
}

func (s *spaceSaving) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !s.less(i, p) {
			return
		}
		s.swap(i, p)
		i = p
	}
}

func (s *spaceSaving) down(i int) {
	for {
		l, m := 2*i+1, i
		if l < len(s.heap) && s.less(l, m) {
			m = l
		}
		if r := l + 1; r < len(s.heap) && s.less(r, m) {
			m = r
		}
		if m == i {
			return
		}
		s.swap(i, m)
		i = m
	}
}

// take returns the window's entries, largest count first (key order on
// ties), and starts a new window.
func (s *spaceSaving) take() []ssEntry {
	out := slices.Clone(s.heap)
	slices.SortFunc(out, func(a, b ssEntry) int {
		return cmp.Or(cmp.Compare(b.count, a.count), cmp.Compare(a.key, b.key))
	})
	s.heap = s.heap[:0]
	clear(s.idx)
	return out
}

// hotState is a node's hot-key state. All of it is guarded by mu; a
// tracker has its own lock, taken on the pull path.
type hotState struct {
	mu       sync.RWMutex           // read-locked on the pull path
	trackers map[string]*hotTracker // by group: pulls served here
	leading  map[string]*hotLeader  // by group: shards this node leads
	replicas map[string]*hotReplica // by group: hot rows read-replicated here
}

type hotTracker struct {
	table string
	shard uint32
	mu    sync.Mutex
	sk    *spaceSaving
}

// hotLeader is a shard leader's view: reports of the current window by
// node, and the hot set it decided.
type hotLeader struct {
	table    string
	shard    uint32
	reports  map[string][]ssEntry
	version  uint64
	keys     []*shardpb.HotKey // sorted by rate, then key
	replicas []string          // read replica node IDs
	assigned map[string]bool   // nodes told they are read replicas
}

// hotReplica is one shard's hot rows on a read replica.
type hotReplica struct {
	table      string
	shard      uint32
	mu         sync.Mutex
	leaderAddr string
	term       uint64
	version    uint64
	renewed    time.Time
	keys       []uint64       // as assigned
	index      map[uint64]int // key -> row, of the rows copied
	rows       []float32
	dim        int
	asOf       time.Time // every push acknowledged before it is in rows
	stop       chan struct{}
}

func (h *hotState) init() {
	h.trackers, h.leading, h.replicas = map[string]*hotTracker{}, map[string]*hotLeader{}, map[string]*hotReplica{}
}

// count records the keys of a pull this node served.
func (n *Node) countHot(spec *shardpb.TableSpec, shard uint32, keys []uint64) {
	if spec.HotThreshold <= 0 {
		return
	}
	gid := api.GroupID(spec.Name, shard)
	n.hot.mu.RLock()
	t := n.hot.trackers[gid]
	n.hot.mu.RUnlock()
	if t == nil {
		n.hot.mu.Lock()
		if t = n.hot.trackers[gid]; t == nil {
			t = &hotTracker{table: spec.Name, shard: shard, sk: newSpaceSaving(hotSketchSize)}
			n.hot.trackers[gid] = t
		}
		n.hot.mu.Unlock()
	}
	t.mu.Lock()
	for _, k := range keys {
		t.sk.add(k, 1)
	}
	t.mu.Unlock()
}

// hotLoop closes a window every HotWindow: reports counts to leaders,
// decides the hot sets of the shards this node leads and assigns their
// read replicas, and expires read replicas no leader renews.
func (n *Node) hotLoop() {
	t := time.NewTicker(HotWindow)
	defer t.Stop()
	for {
		select {
		case <-n.closed:
			n.hot.mu.Lock()
			for gid, r := range n.hot.replicas {
				close(r.stop)
				delete(n.hot.replicas, gid)
			}
			n.hot.mu.Unlock()
			return
		case <-t.C:
		}
		n.hotWindow()
	}
}

func (n *Node) hotWindow() {
	n.hot.mu.Lock()
	trackers := make([]*hotTracker, 0, len(n.hot.trackers))
	for _, t := range n.hot.trackers {
		trackers = append(trackers, t)
	}
	n.hot.mu.Unlock()
	for _, t := range trackers {
		t.mu.Lock()
		entries := t.sk.take()
		t.mu.Unlock()
		if len(entries) == 0 {
			// Idle for a window: forget it (a pull recreates it), so the
			// shards this node stopped serving leave nothing behind.
			n.hot.mu.Lock()
			if t.mu.TryLock() {
				if len(t.sk.heap) == 0 {
					delete(n.hot.trackers, api.GroupID(t.table, t.shard))
				}
				t.mu.Unlock()
			}
			n.hot.mu.Unlock()
			continue
		}
		n.reportHot(t.table, t.shard, entries)
	}
	n.decideHot()
	n.expireHotReplicas()
}

// hotLead says whether this node decides table/shard's hot set: it leads
// the shard's Raft group, or is the head of its chain. term orders the
// decider's messages at the read replicas: the Raft term, or the chain's
// epoch (each only grows, and a table's replication never changes).
// leader is the decider's peer address as this node knows it, "" when this
// node holds no replica of the shard or knows of no leader.
//
// The term is read before the role: a change in between can then only
// pair the role with an older term, which loses to the true leader's.
func (n *Node) hotLead(table string, shard uint32) (leads bool, term uint64, leader string) {
	if g := n.Group(table, shard); g != nil {
		term := g.Raft().CurrentTerm()
		if g.IsLeader() {
			return true, term, n.cfg.PeerAddr
		}
		a, _ := g.Raft().LeaderWithID()
		return false, term, string(a)
	}
	ch := n.Chain(table, shard)
	if ch == nil {
		return false, 0, ""
	}
	epoch := ch.Epoch()
	role, order := ch.Role(), ch.Order()
	if sm := n.metaFSM.ShardMap(table, shard); sm != nil && sm.Epoch > epoch {
		// A replica behind the map may believe itself head of an order
		// that is gone (chainFor refuses its reads for that reason); the
		// map's head decides.
		if len(sm.Replicas) > 0 {
			if nd := n.metaFSM.Node(sm.Replicas[0]); nd != nil {
				return false, epoch, nd.PeerAddr
			}
		}
		return false, epoch, ""
	}
	if role == chain.RoleHead {
		return true, epoch, n.cfg.PeerAddr
	}
	if len(order) > 0 {
		return false, epoch, order[0]
	}
	return false, epoch, ""
}

// reportHot hands a window's counts to the shard's leader: directly if it
// is this node, else by a best-effort ReportHot (a lost report makes the
// leader under-count one window).
func (n *Node) reportHot(table string, shard uint32, entries []ssEntry) {
	gid := api.GroupID(table, shard)
	leads, _, leaderAddr := n.hotLead(table, shard)
	if leads {
		n.addReport(table, shard, n.cfg.ID, entries)
		return
	}
	if leaderAddr == "" {
		n.hot.mu.Lock()
		if r := n.hot.replicas[gid]; r != nil {
			r.mu.Lock()
			leaderAddr = r.leaderAddr
			r.mu.Unlock()
		}
		n.hot.mu.Unlock()
	}
	if leaderAddr == "" {
		return
	}
	keys := make([]uint64, len(entries))
	counts := make([]uint64, len(entries))
	for i, e := range entries {
		keys[i], counts[i] = e.key, e.count
	}
	req := &shardpb.ReportHotRequest{Table: table, Shard: shard, NodeId: n.cfg.ID, Keys: api.KeysBytes(keys), Counts: counts}
	n.spawn(func() {
		ps, err := n.peerStub(leaderAddr)
		if err != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), HotWindow/2)
		defer cancel()
		if _, err := ps.ReportHot(ctx, req); err != nil {
			n.log.Debug("hot-key report not delivered", "group", gid, "leader", leaderAddr, "error", err)
		}
	})
}

// addReport records one node's window of counts at this shard leader; a
// later report of the same node in the same window replaces it.
func (n *Node) addReport(table string, shard uint32, node string, entries []ssEntry) {
	gid := api.GroupID(table, shard)
	n.hot.mu.Lock()
	defer n.hot.mu.Unlock()
	l := n.hot.leading[gid]
	if l == nil {
		l = &hotLeader{table: table, shard: shard, reports: map[string][]ssEntry{}, assigned: map[string]bool{}}
		n.hot.leading[gid] = l
	}
	l.reports[node] = entries
}

func (s *peerService) ReportHot(ctx context.Context, req *shardpb.ReportHotRequest) (*shardpb.ReportHotResponse, error) {
	keys, err := api.DecodeKeys(req.Keys, nil)
	if err != nil {
		return nil, s.n.toStatus(err)
	}
	if len(keys) != len(req.Counts) || len(keys) > hotSketchSize {
		return nil, s.n.toStatus(fmt.Errorf("%w: hot-key report of %d keys and %d counts (at most %d)", api.ErrBadRequest, len(keys), len(req.Counts), hotSketchSize))
	}
	if leads, _, _ := s.n.hotLead(req.Table, req.Shard); !leads {
		return nil, s.n.toStatus(fmt.Errorf("group %s: %w: node %s does not lead it", api.GroupID(req.Table, req.Shard), api.ErrNotReplica, s.n.cfg.ID))
	}
	entries := make([]ssEntry, len(keys))
	for i := range keys {
		entries[i] = ssEntry{key: keys[i], count: req.Counts[i]}
	}
	s.n.addReport(req.Table, req.Shard, req.NodeId, entries)
	return &shardpb.ReportHotResponse{}, nil
}

// decideHot closes the window of every shard this node leads: adds up the
// reports, updates the hot set and (re)assigns its read replicas.
func (n *Node) decideHot() {
	n.hot.mu.Lock()
	defer n.hot.mu.Unlock()
	for gid, l := range n.hot.leading {
		leads, term, _ := n.hotLead(l.table, l.shard)
		spec := n.metaFSM.Table(l.table)
		if !leads || spec == nil || spec.HotThreshold <= 0 {
			// Not leading any more, or hot keys were turned off: release the
			// read replicas (a new leader assigns its own). The release
			// carries this node's term, so a read replica does not take it
			// for a message older than its assignment.
			for id := range l.assigned {
				n.assignHot(l, id, nil, term)
			}
			delete(n.hot.leading, gid)
			continue
		}
		sums := map[uint64]uint64{}
		for _, entries := range l.reports {
			for _, e := range entries {
				sums[e.key] += e.count
			}
		}
		clear(l.reports)
		wasHot := map[uint64]bool{}
		for _, k := range l.keys {
			wasHot[k.Key] = true
		}
		var keys []*shardpb.HotKey
		for k, c := range sums {
			rate := float64(c) / HotWindow.Seconds()
			if rate >= spec.HotThreshold || (wasHot[k] && rate >= spec.HotThreshold/2) {
				keys = append(keys, &shardpb.HotKey{Key: k, Rate: rate})
			}
		}
		slices.SortFunc(keys, func(a, b *shardpb.HotKey) int {
			return cmp.Or(cmp.Compare(b.Rate, a.Rate), cmp.Compare(a.Key, b.Key))
		})
		if len(keys) > MaxHotKeys {
			keys = keys[:MaxHotKeys]
		}
		if !sameHotKeys(keys, l.keys) {
			l.version++
		}
		l.keys = keys
		var replicas []string
		if len(keys) > 0 {
			replicas = n.pickHotReplicas(l.table, l.shard, int(spec.HotReplicas))
		}
		l.replicas = replicas
		hotKeys := make([]uint64, len(keys))
		for i, k := range keys {
			hotKeys[i] = k.Key
		}
		chosen := map[string]bool{}
		for _, id := range replicas {
			chosen[id] = true
			n.assignHot(l, id, hotKeys, term)
		}
		for id := range l.assigned {
			if !chosen[id] {
				n.assignHot(l, id, nil, term)
			}
		}
		if len(keys) == 0 && len(l.assigned) == 0 && len(sums) == 0 {
			delete(n.hot.leading, gid)
		}
	}
}

func sameHotKeys(a, b []*shardpb.HotKey) bool {
	if len(a) != len(b) {
		return false
	}
	set := map[uint64]bool{}
	for _, k := range a {
		set[k.Key] = true
	}
	for _, k := range b {
		if !set[k.Key] {
			return false
		}
	}
	return true
}

// pickHotReplicas chooses up to want nodes outside the shard's replica set
// to hold its hot rows: active, alive nodes in rendezvous order of the
// group, so the choice is stable while the cluster is.
func (n *Node) pickHotReplicas(table string, shard uint32, want int) []string {
	sm := n.metaFSM.ShardMap(table, shard)
	if sm == nil || want <= 0 {
		return nil
	}
	alive := n.members.AliveIDs()
	gid := api.GroupID(table, shard)
	type cand struct {
		id    string
		score uint64
	}
	var cands []cand
	for _, node := range n.metaFSM.ClusterMap().Nodes {
		if node.Admin != shardpb.NodeAdmin_NODE_ACTIVE || !alive[node.Id] || isReplica(sm, node.Id) || node.Id == sm.Adding {
			continue
		}
		h := fnv.New64a()
		h.Write([]byte(gid))
		h.Write([]byte{0})
		h.Write([]byte(node.Id))
		cands = append(cands, cand{node.Id, api.Mix64(h.Sum64())})
	}
	slices.SortFunc(cands, func(a, b cand) int { return cmp.Compare(b.score, a.score) })
	var out []string
	for _, c := range cands[:min(want, len(cands))] {
		out = append(out, c.id)
	}
	slices.Sort(out)
	return out
}

// assignHot tells node id it holds keys of l's shard (none: no longer);
// best effort, renewed every window. n.hot.mu is held.
func (n *Node) assignHot(l *hotLeader, id string, keys []uint64, term uint64) {
	if len(keys) > 0 {
		l.assigned[id] = true
	} else {
		delete(l.assigned, id)
	}
	node := n.metaFSM.Node(id)
	if node == nil {
		return
	}
	req := &shardpb.AssignHotRequest{Table: l.table, Shard: l.shard, Version: l.version, Term: term, Keys: api.KeysBytes(keys), LeaderAddr: n.cfg.PeerAddr}
	n.spawn(func() {
		ps, err := n.peerStub(node.PeerAddr)
		if err != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), HotWindow/2)
		defer cancel()
		if _, err := ps.AssignHot(ctx, req); err != nil {
			n.log.Debug("hot-key assignment not delivered", "group", api.GroupID(l.table, l.shard), "node", id, "error", err)
		}
	})
}

func (s *peerService) AssignHot(ctx context.Context, req *shardpb.AssignHotRequest) (*shardpb.AssignHotResponse, error) {
	keys, err := api.DecodeKeys(req.Keys, nil)
	if err != nil {
		return nil, s.n.toStatus(err)
	}
	if len(keys) > MaxHotKeys {
		return nil, s.n.toStatus(fmt.Errorf("%w: %d hot keys (at most %d)", api.ErrBadRequest, len(keys), MaxHotKeys))
	}
	spec := s.n.metaFSM.Table(req.Table)
	if spec == nil {
		return nil, s.n.toStatus(fmt.Errorf("table %q: %w", req.Table, api.ErrUnavailable))
	}
	if req.Shard >= spec.Shards {
		return nil, s.n.toStatus(fmt.Errorf("table %q has %d shards, not shard %d: %w", req.Table, spec.Shards, req.Shard, api.ErrUnknownShard))
	}
	n := s.n
	gid := api.GroupID(req.Table, req.Shard)
	n.hot.mu.Lock()
	defer n.hot.mu.Unlock()
	r := n.hot.replicas[gid]
	if r != nil {
		r.mu.Lock()
		// A release from the leader that assigned it always counts.
		older := (req.Term < r.term || (req.Term == r.term && req.Version < r.version)) &&
			!(len(keys) == 0 && req.LeaderAddr == r.leaderAddr)
		r.mu.Unlock()
		if older {
			return &shardpb.AssignHotResponse{}, nil
		}
	}
	if len(keys) == 0 {
		if r != nil {
			close(r.stop)
			delete(n.hot.replicas, gid)
		}
		return &shardpb.AssignHotResponse{}, nil
	}
	if r == nil {
		r = &hotReplica{table: req.Table, shard: req.Shard, dim: int(spec.Dim), stop: make(chan struct{})}
		if !n.spawn(func() { n.refreshHotLoop(r) }) {
			return nil, s.n.toStatus(fmt.Errorf("node %s: %w: stopping", n.cfg.ID, api.ErrUnavailable))
		}
		n.hot.replicas[gid] = r
	}
	r.mu.Lock()
	r.leaderAddr, r.term, r.version, r.renewed = req.LeaderAddr, req.Term, req.Version, time.Now()
	r.keys = keys
	r.mu.Unlock()
	return &shardpb.AssignHotResponse{}, nil
}

// expireHotReplicas drops read replicas no leader renewed lately.
func (n *Node) expireHotReplicas() {
	n.hot.mu.Lock()
	defer n.hot.mu.Unlock()
	for gid, r := range n.hot.replicas {
		r.mu.Lock()
		old := time.Since(r.renewed) > hotAssignTTL
		r.mu.Unlock()
		if old {
			close(r.stop)
			delete(n.hot.replicas, gid)
		}
	}
}

// refreshHotLoop copies r's hot rows from the shard leader until r stops:
// every quarter of a bounded table's bound (so a steady copy is never older
// than half of it when served), else every hotEventualRefresh.
func (n *Node) refreshHotLoop(r *hotReplica) {
	for {
		every := hotEventualRefresh
		if spec := n.metaFSM.Table(r.table); spec != nil && spec.Consistency == shardpb.Consistency_CONSISTENCY_BOUNDED {
			// At least 10ms apart: a copy is a linearizable read on the
			// leader, and a tiny bound must not turn into a storm of them.
			every = max(time.Duration(spec.StalenessBoundNs)/4, 10*time.Millisecond)
		}
		n.refreshHot(r)
		select {
		case <-r.stop:
			return
		case <-n.closed:
			return
		case <-time.After(every):
		}
	}
}

// hotRefreshTimeout bounds a read replica's copy of its hot rows.
const hotRefreshTimeout = time.Second

func (n *Node) refreshHot(r *hotReplica) {
	r.mu.Lock()
	addr, keys := r.leaderAddr, slices.Clone(r.keys)
	r.mu.Unlock()
	ps, err := n.peerStub(addr)
	if err != nil {
		return
	}
	ctx, cancel := n.callContext(hotRefreshTimeout, r.stop)
	defer cancel()
	sent := time.Now()
	resp, err := ps.HotRows(ctx, &shardpb.HotRowsRequest{Table: r.table, Shard: r.shard, Keys: api.KeysBytes(keys)})
	if err != nil {
		n.log.Debug("hot rows not refreshed", "group", api.GroupID(r.table, r.shard), "leader", addr, "error", err)
		return
	}
	rows, err := api.DecodeValues(resp.Values, nil)
	if err != nil || len(rows) != len(keys)*r.dim {
		n.log.Warn("hot rows answer malformed", "group", api.GroupID(r.table, r.shard), "leader", addr, "values", len(rows), "keys", len(keys))
		return
	}
	index := make(map[uint64]int, len(keys))
	for i, k := range keys {
		index[k] = i
	}
	r.mu.Lock()
	r.index, r.rows, r.asOf = index, rows, sent
	r.mu.Unlock()
}

func (s *peerService) HotRows(ctx context.Context, req *shardpb.HotRowsRequest) (*shardpb.HotRowsResponse, error) {
	keys, err := api.DecodeKeys(req.Keys, nil)
	if err != nil {
		return nil, s.n.toStatus(err)
	}
	if len(keys) > MaxHotKeys {
		return nil, s.n.toStatus(fmt.Errorf("%w: %d hot keys (at most %d)", api.ErrBadRequest, len(keys), MaxHotKeys))
	}
	spec := s.n.metaFSM.Table(req.Table)
	if spec == nil {
		return nil, s.n.toStatus(fmt.Errorf("group %s: %w: no replica on node %s", api.GroupID(req.Table, req.Shard), api.ErrNotReplica, s.n.cfg.ID))
	}
	out := make([]float32, len(keys)*int(spec.Dim))
	ix, err := s.n.readHotRows(ctx, spec, req.Shard, keys, out)
	if err != nil {
		return nil, s.n.toStatus(err)
	}
	return &shardpb.HotRowsResponse{Values: api.ValuesBytes(out), AppliedIndex: ix}, nil
}

// readHotRows is a linearizable read of keys' rows from this node's replica
// of the shard: through its Raft group, or by CRAQ from its chain member.
func (n *Node) readHotRows(ctx context.Context, spec *shardpb.TableSpec, shard uint32, keys []uint64, out []float32) (uint64, error) {
	if api.IsChain(spec) {
		ch, err := n.chainFor(spec, shard, 0)
		if err != nil {
			return 0, err
		}
		return n.chainRead(ctx, ch, keys, out, shardpb.Consistency_CONSISTENCY_LINEARIZABLE, 0)
	}
	g := n.Group(spec.Name, shard)
	if g == nil {
		return 0, fmt.Errorf("group %s: %w: no replica on node %s", api.GroupID(spec.Name, shard), api.ErrNotReplica, n.cfg.ID)
	}
	if err := g.Pull(ctx, keys, out, true); err != nil {
		return 0, err
	}
	return g.AppliedIndex(), nil
}

// serveHot serves a pull from this node's hot rows of the shard, if it
// read-replicates every key asked and its copy is fresh enough for level.
// ok is false if the request is not one for its hot rows at all (none of
// the shard's, a linearizable read, a key it does not hold): the caller
// then treats it as any request for a shard this node does not hold, so a
// client with an old map is told to refresh it.
func (n *Node) serveHot(spec *shardpb.TableSpec, shard uint32, keys []uint64, level shardpb.Consistency, bound time.Duration) (out []float32, ok bool, err error) {
	gid := api.GroupID(spec.Name, shard)
	n.hot.mu.RLock()
	r := n.hot.replicas[gid]
	n.hot.mu.RUnlock()
	if r == nil || level == shardpb.Consistency_CONSISTENCY_LINEARIZABLE {
		return nil, false, nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, k := range keys {
		if _, has := r.index[k]; !has && !r.asOf.IsZero() {
			return nil, false, nil
		}
	}
	if r.asOf.IsZero() {
		return nil, true, fmt.Errorf("group %s: %w: node %s has not copied them yet", gid, api.ErrNotHot, n.cfg.ID)
	}
	switch age := leaseAge(r.asOf, time.Now()); level {
	case shardpb.Consistency_CONSISTENCY_BOUNDED:
		if age > bound {
			return nil, true, fmt.Errorf("group %s: %w: node %s's copy is %s old, over the %s bound", gid, api.ErrNotHot, n.cfg.ID, age.Round(time.Millisecond), bound)
		}
	case shardpb.Consistency_CONSISTENCY_EVENTUAL:
		if age > eventualAbandon {
			return nil, true, fmt.Errorf("group %s: %w: node %s's copy is %s old", gid, api.ErrNotHot, n.cfg.ID, age.Round(time.Millisecond))
		}
	default:
		return nil, true, fmt.Errorf("group %s: %w: read replicas do not serve %s reads", gid, api.ErrNotHot, api.LevelName(level))
	}
	if r.dim != int(spec.Dim) {
		return nil, true, fmt.Errorf("group %s: %w: copy of dim %d", gid, api.ErrNotHot, r.dim)
	}
	out = make([]float32, len(keys)*r.dim)
	for i, k := range keys {
		j := r.index[k] // present: checked above
		copy(out[i*r.dim:(i+1)*r.dim], r.rows[j*r.dim:(j+1)*r.dim])
	}
	return out, true, nil
}

// hotShards returns the hot sets of the shards this node leads (of table,
// or of all tables if it is empty), by table and shard.
func (n *Node) hotShards(table string) []*shardpb.HotShard {
	n.hot.mu.Lock()
	defer n.hot.mu.Unlock()
	var out []*shardpb.HotShard
	for _, l := range n.hot.leading {
		if (table != "" && l.table != table) || len(l.keys) == 0 {
			continue
		}
		leads, term, _ := n.hotLead(l.table, l.shard)
		if !leads {
			continue
		}
		hs := &shardpb.HotShard{Table: l.table, Shard: l.shard, Version: l.version, Keys: l.keys, Term: term}
		for _, id := range l.replicas {
			if node := n.metaFSM.Node(id); node != nil {
				hs.ReplicaIds, hs.ReplicaAddrs = append(hs.ReplicaIds, id), append(hs.ReplicaAddrs, node.Addr)
			}
		}
		out = append(out, hs)
	}
	slices.SortFunc(out, func(a, b *shardpb.HotShard) int {
		return cmp.Or(cmp.Compare(a.Table, b.Table), cmp.Compare(a.Shard, b.Shard))
	})
	return out
}

func (s *service) HotKeys(ctx context.Context, req *shardpb.HotKeysRequest) (*shardpb.HotKeysResponse, error) {
	return &shardpb.HotKeysResponse{Shards: s.n.hotShards(req.Table)}, nil
}

// HotShards returns the hot sets of the shards of table (all tables if
// empty) that this node leads.
func (n *Node) HotShards(table string) []*shardpb.HotShard { return n.hotShards(table) }

// ReadReplicates reports whether this node holds hot rows of table/shard
// as a read replica.
func (n *Node) ReadReplicates(table string, shard uint32) bool {
	n.hot.mu.Lock()
	defer n.hot.mu.Unlock()
	return n.hot.replicas[api.GroupID(table, shard)] != nil
}
