package client

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/raftps/raftps/shard/shardpb"
)

// NodeStatus is one node's status: its view of the cluster and the
// replicas it holds.
type NodeStatus struct {
	NodeID string `json:"node_id"`
	Addr   string `json:"addr"`
	// Nodes: every node as this one sees it.
	Nodes []NodeInfo `json:"nodes"`
	// Replicas: the metadata group's and every shard replica this node
	// holds.
	Replicas []ReplicaStatus `json:"replicas"`
	// Jobs as this node's metadata replica has applied them, by name.
	Jobs []JobInfo `json:"jobs"`
	// UnderReplicated: table shards with fewer replicas on live nodes (by
	// this node's gossip) than their table's replicas.
	UnderReplicated int `json:"under_replicated"`
	// MapVersion: this node's cluster map version; Moving: the shards
	// gaining a replica.
	MapVersion uint64      `json:"map_version"`
	Moving     []Placement `json:"moving"`
	// Load: what the node served since it started, its disk and memory.
	Load *NodeLoad `json:"load,omitempty"`
	// Hot: the hot sets of the shards this node leads.
	Hot []HotShard `json:"hot"`
	// Served: the pulls this node served, by role and level, since it
	// started.
	Served []ServedCount `json:"served"`
	// SetAside: the replicas this node set aside since it started, their
	// files having failed their checks at open; Disk: its data disk.
	SetAside []SetAsideReplica `json:"set_aside,omitempty"`
	Disk     *DiskStatus       `json:"disk,omitempty"`
}

// SetAsideReplica is a replica whose files a node moved aside, kept for
// inspection, to be rebuilt from its peers.
type SetAsideReplica struct {
	Group   string    `json:"group"`
	Node    string    `json:"node"`
	Reason  string    `json:"reason"`
	MovedTo string    `json:"moved_to"`
	At      time.Time `json:"at"`
	// Reopened: the node has opened a new replica in its place (rebuilt or
	// being rebuilt from its peers).
	Reopened bool `json:"reopened"`
}

// DiskStatus is a node's data disk: its free space, and whether the node
// refuses pushes for lack of it (Full, with Reason).
type DiskStatus struct {
	FreeBytes       uint64 `json:"free_bytes"`
	TotalBytes      uint64 `json:"total_bytes"`
	MinFreeBytes    uint64 `json:"min_free_bytes"`
	Full            bool   `json:"full"`
	Reason          string `json:"reason,omitempty"`
	ReserveReleased bool   `json:"reserve_released,omitempty"`
}

// NodeInfo is one node as another sees it.
type NodeInfo struct {
	ID   string `json:"id"`
	Addr string `json:"addr"`
	// State: liveness by gossip, "alive", "suspect" or "dead" (also a node
	// that left or was never heard from).
	State string `json:"state"`
	// Replicas the cluster map places on the node; Leaders: the shard
	// groups it leads, as it last gossiped.
	Replicas int `json:"replicas"`
	Leaders  int `json:"leaders"`
	// Admin: "active", "draining", "removed", or "unregistered".
	Admin string `json:"admin"`
}

// ReplicaStatus is one replica on one node.
type ReplicaStatus struct {
	// Group is "meta" for the metadata group, else "table/shard".
	Group string `json:"group"`
	Node  string `json:"node"`
	Table string `json:"-"`
	Shard int    `json:"-"`
	// State: "leader", "follower", "candidate" or "shutdown".
	State string `json:"state"`
	// Leader is the leader's node ID as this replica knows it.
	Leader     string `json:"leader"`
	LeaderAddr string `json:"-"`
	Term       uint64 `json:"term"`
	Applied    uint64 `json:"applied_index"`
	Commit     uint64 `json:"commit_index"`
	Last       uint64 `json:"last_index"`
	Rows       uint64 `json:"rows"`
	Memory     uint64 `json:"memory_bytes"`
	// Replication is "raft" or "chain". For a chain replica State is
	// "leader" on the head (as for a Raft group, so tools read both alike),
	// Leader the head, Term the epoch, Commit what the replica knows the
	// tail applied, and ChainRole, ChainEpoch and ChainOrder (node IDs,
	// head first) its configuration.
	Replication   string   `json:"replication"`
	ChainRole     string   `json:"chain_role,omitempty"`
	ChainEpoch    uint64   `json:"chain_epoch,omitempty"`
	ChainOrder    []string `json:"chain_order,omitempty"`
	ChainCaughtUp bool     `json:"-"`
	// Quiet: a Raft replica on its group's quiet timing (the group has
	// been idle; raftps server --quiesce-after).
	Quiet bool `json:"quiet,omitempty"`
	// Dormant: a Raft replica of a dormant group (no leader until a
	// request needs one; raftps server --dormant-after).
	Dormant bool `json:"dormant,omitempty"`
	// Checksum of the rows at Applied, if asked for (replicas of one shard
	// at the same applied index must agree).
	Checksum *uint64 `json:"checksum,omitempty"`
}

// HotShard is a shard's hot set as its leader has it.
type HotShard struct {
	Table   string   `json:"table"`
	Shard   int      `json:"shard"`
	Version uint64   `json:"version"`
	Term    uint64   `json:"term"`
	Keys    []HotKey `json:"keys"`
	// The read replicas' node IDs and client addresses.
	ReplicaIDs   []string `json:"replica_ids"`
	ReplicaAddrs []string `json:"replica_addrs"`
}

// HotKey is a hot key and its pulls a second over the last window, all
// replicas together.
type HotKey struct {
	Key  uint64  `json:"key"`
	Rate float64 `json:"rate"`
}

// ServedCount counts the pulls one node served in one role ("leader",
// "follower", "read-replica") at one level ("linearizable", "bounded",
// "eventual"), and those it refused as too stale (the client went
// elsewhere).
type ServedCount struct {
	Node     string `json:"node"`
	Role     string `json:"role"`
	Level    string `json:"level"`
	Requests uint64 `json:"requests"`
	Rows     uint64 `json:"rows"`
	Refused  uint64 `json:"refused"`
}

// NodeLoad counts the data calls a node answered since it started and
// their server-side latency (calls per bucket, whose upper bounds in
// seconds are LatencyBounds; the last count is for calls slower than all
// of them), with its disk (data dir's file system) and resident memory.
// Rates and percentiles are differences between two readings.
type NodeLoad struct {
	PullRows      uint64    `json:"pull_rows"`
	PushRows      uint64    `json:"push_rows"`
	Pulls         uint64    `json:"pulls"`
	Pushes        uint64    `json:"pushes"`
	LatencyBounds []float64 `json:"latency_bounds"`
	PullLatency   []uint64  `json:"pull_latency"`
	PushLatency   []uint64  `json:"push_latency"`
	DiskFree      uint64    `json:"disk_free_bytes"`
	DiskSize      uint64    `json:"disk_size_bytes"`
	RSS           uint64    `json:"rss_bytes"`
}

// StatusFromProto converts a node's Status answer; for servers and tools
// that ask for it over another path than a Client (GatherStatus).
func StatusFromProto(r *shardpb.StatusResponse) NodeStatus {
	st := NodeStatus{NodeID: r.NodeId, Addr: r.Addr, UnderReplicated: int(r.UnderReplicated), MapVersion: r.MapVersion}
	if l := r.Load; l != nil {
		st.Load = &NodeLoad{PullRows: l.PullRows, PushRows: l.PushRows, Pulls: l.Pulls, Pushes: l.Pushes,
			LatencyBounds: l.LatencyBounds, PullLatency: l.PullLatency, PushLatency: l.PushLatency,
			DiskFree: l.DiskFreeBytes, DiskSize: l.DiskSizeBytes, RSS: l.RssBytes}
	}
	for _, n := range r.Nodes {
		st.Nodes = append(st.Nodes, NodeInfo{ID: n.Id, Addr: n.Addr, State: n.State, Replicas: int(n.Replicas), Leaders: int(n.Leaders), Admin: n.Admin})
	}
	for _, rs := range r.Replicas {
		rep := ReplicaStatus{Group: rs.Group, Node: r.NodeId, Table: rs.Table, Shard: int(rs.Shard), State: rs.State,
			Leader: rs.LeaderId, LeaderAddr: rs.LeaderAddr, Term: rs.Term, Applied: rs.AppliedIndex, Commit: rs.CommitIndex,
			Last: rs.LastIndex, Rows: rs.Rows, Memory: rs.MemoryBytes, Replication: cmp.Or(rs.Replication, "raft"),
			ChainRole: rs.ChainRole, ChainEpoch: rs.ChainEpoch, ChainOrder: rs.ChainOrder, ChainCaughtUp: rs.ChainCaughtUp, Quiet: rs.Quiet, Dormant: rs.Dormant}
		if rs.HasChecksum {
			sum := rs.Checksum
			rep.Checksum = &sum
		}
		st.Replicas = append(st.Replicas, rep)
	}
	for _, j := range r.Jobs {
		st.Jobs = append(st.Jobs, jobInfoOf(j))
	}
	for _, sm := range r.Moving {
		st.Moving = append(st.Moving, placementOf(sm))
	}
	for _, hs := range r.Hot {
		h := HotShard{Table: hs.Table, Shard: int(hs.Shard), Version: hs.Version, Term: hs.Term, ReplicaIDs: hs.ReplicaIds, ReplicaAddrs: hs.ReplicaAddrs}
		for _, k := range hs.Keys {
			h.Keys = append(h.Keys, HotKey{Key: k.Key, Rate: k.Rate})
		}
		st.Hot = append(st.Hot, h)
	}
	for _, c := range r.Served {
		st.Served = append(st.Served, ServedCount{Node: r.NodeId, Role: c.Role, Level: c.Level, Requests: c.Requests, Rows: c.Rows, Refused: c.Refused})
	}
	for _, a := range r.SetAside {
		st.SetAside = append(st.SetAside, SetAsideReplica{Group: a.Group, Node: r.NodeId, Reason: a.Reason, MovedTo: a.MovedTo, At: time.UnixMilli(a.AtUnixMs), Reopened: a.Reopened})
	}
	if d := r.Disk; d != nil {
		st.Disk = &DiskStatus{FreeBytes: d.FreeBytes, TotalBytes: d.TotalBytes, MinFreeBytes: d.MinFreeBytes, Full: d.Full, Reason: d.Reason, ReserveReleased: d.ReserveReleased}
	}
	return st
}

// ClusterStatus is the cluster as ClusterStatus pieces it together from
// every node it reaches: what raftps status prints.
type ClusterStatus struct {
	Nodes           []ClusterNode `json:"nodes"`
	MapVersion      uint64        `json:"map_version"`
	UnderReplicated int           `json:"under_replicated"`
	// Moving: shards gaining a replica (Adding catches up as a non-voter,
	// then becomes a voter).
	Moving   []Placement     `json:"moving"`
	Replicas []ReplicaStatus `json:"replicas"`
	Jobs     []JobSummary    `json:"jobs"`
	Hot      []HotKeyRow     `json:"hot"`
	Served   []ServedCount   `json:"served"`
	// SetAside: every answering node's set-aside replicas.
	SetAside []SetAsideReplica `json:"set_aside"`
}

// ClusterNode is one node in a ClusterStatus: its liveness by gossip and
// its admin state as the metadata leader (else the first node that
// answered) sees them, the shard replicas the cluster map places on it, the
// shard groups it leads, and whether ClusterStatus reached it.
type ClusterNode struct {
	ID       string `json:"id"`
	Addr     string `json:"addr"`
	State    string `json:"state"` // "alive", "suspect" or "dead" by gossip; "unknown" if no node said
	Admin    string `json:"admin"` // "active", "draining", "removed" or "unregistered"; "" if no node said
	Replicas int    `json:"replicas"`
	Leaders  int    `json:"leaders"`
	RPC      string `json:"rpc"` // "up", "not asked", or "unreachable: ..."
	// Disk: the node's data disk, as it answered itself.
	Disk *DiskStatus `json:"disk,omitempty"`
	// Load: the node's own answer (nil if it did not answer).
	Load *NodeLoad `json:"load,omitempty"`
}

// JobSummary is a job's current round: how many of its ranks registered.
type JobSummary struct {
	Name       string `json:"name"`
	Round      uint64 `json:"round"`
	Registered int    `json:"registered"`
	World      int    `json:"world"`
}

// HotKeyRow is one hot key of a table shard, as the shard's leader has it,
// and the read replicas (node IDs) that serve it besides the shard.
type HotKeyRow struct {
	Table        string   `json:"table"`
	Shard        int      `json:"shard"`
	Key          uint64   `json:"key"`
	Rate         float64  `json:"rate"` // pulls a second, all replicas together
	ReadReplicas []string `json:"read_replicas"`
}

// Node returns the status's entry of the node with ID id.
func (s ClusterStatus) Node(id string) (ClusterNode, bool) {
	for _, n := range s.Nodes {
		if n.ID == id {
			return n, true
		}
	}
	return ClusterNode{}, false
}

// ClusterStatus asks every node it can find for its status, starting with
// the client's addresses and following every node they name, and pieces
// the answers together. Nodes that do not answer are listed as unreachable;
// only a cluster of which no node answers is an error.
func (a *Admin) ClusterStatus(ctx context.Context, o StatusOptions) (ClusterStatus, error) {
	return GatherStatus(ctx, a.c.Addrs(), o.Timeout, func(ctx context.Context, addr string) (NodeStatus, error) {
		return a.NodeStatus(ctx, addr, o.Checksums)
	})
}

// StatusFetcher returns the status of the node whose client address is addr.
type StatusFetcher func(ctx context.Context, addr string) (NodeStatus, error)

// GatherStatus is ClusterStatus with another way to ask each node: a node
// serving its dashboard asks its peers over the peer API. It starts with
// the nodes at seeds (client addresses) and follows every node they name,
// waiting up to timeout (default 3s) for each.
func GatherStatus(ctx context.Context, seeds []string, timeout time.Duration, fetch StatusFetcher) (ClusterStatus, error) {
	if timeout <= 0 {
		timeout = 3 * time.Second
	}
	addrs := slices.Clone(seeds)
	seen := map[string]bool{}
	// Jobs and the gossip view as the metadata leader has them (the
	// freshest view), else as the first node that answered has them.
	view := -1                    // index in answers
	rpc := map[string]string{}    // by address
	self := map[string]NodeInfo{} // each answering node about itself
	disks := map[string]*DiskStatus{}
	loads := map[string]*NodeLoad{}
	var answers []NodeStatus
	var out ClusterStatus
	var lastErr error
	for i := 0; i < len(addrs); i++ {
		addr := addrs[i]
		if seen[addr] {
			continue
		}
		seen[addr] = true
		nctx, cancel := context.WithTimeout(ctx, timeout)
		st, err := fetch(nctx, addr)
		cancel()
		if err != nil {
			rpc[addr] = "unreachable: " + err.Error()
			lastErr = err
			continue
		}
		rpc[addr] = "up"
		answers = append(answers, st)
		out.Served = append(out.Served, st.Served...)
		out.SetAside = append(out.SetAside, st.SetAside...)
		if st.Disk != nil {
			disks[st.NodeID] = st.Disk
		}
		loads[st.NodeID] = st.Load
		for _, p := range st.Nodes {
			if p.ID == st.NodeID {
				self[p.ID] = p
			}
			if p.Addr != "" {
				addrs = append(addrs, p.Addr)
			}
		}
		metaLeader := false
		for _, r := range st.Replicas {
			out.Replicas = append(out.Replicas, r)
			metaLeader = metaLeader || (r.Group == "meta" && r.State == "leader")
		}
		if metaLeader || view < 0 {
			view = len(answers) - 1
		}
	}
	if len(answers) == 0 {
		return ClusterStatus{}, fmt.Errorf("cluster status: no node answered: %w", lastErr)
	}
	v := answers[view]
	out.Moving, out.Jobs = []Placement{}, []JobSummary{}
	out.UnderReplicated, out.MapVersion = v.UnderReplicated, v.MapVersion
	out.Moving = append(out.Moving, v.Moving...)
	for _, j := range v.Jobs {
		out.Jobs = append(out.Jobs, JobSummary{Name: j.Name, Round: j.Round, Registered: j.Registered(), World: j.World})
	}
	for _, p := range v.Nodes {
		// Replicas come from the viewing node's map (the metadata
		// leader's is the freshest); leaders from each node about itself,
		// else as it last gossiped.
		nd := ClusterNode{ID: p.ID, Addr: p.Addr, State: p.State, Admin: p.Admin, Replicas: p.Replicas, Leaders: p.Leaders, RPC: rpc[p.Addr]}
		if me, ok := self[p.ID]; ok {
			nd.Leaders = me.Leaders
		}
		nd.Disk = disks[p.ID]
		nd.Load = loads[p.ID]
		if nd.RPC == "" {
			nd.RPC = "not asked"
		}
		out.Nodes = append(out.Nodes, nd)
		delete(rpc, p.Addr)
	}
	for addr, r := range rpc {
		out.Nodes = append(out.Nodes, ClusterNode{Addr: addr, State: "unknown", RPC: r})
	}
	slices.SortFunc(out.Nodes, func(a, b ClusterNode) int { return strings.Compare(a.Addr, b.Addr) })
	slices.SortFunc(out.Replicas, func(a, b ReplicaStatus) int {
		return cmp.Or(strings.Compare(a.Group, b.Group), strings.Compare(a.Node, b.Node))
	})
	// Stable: each node's counters stay in the order it gave them.
	slices.SortStableFunc(out.Served, func(a, b ServedCount) int { return strings.Compare(a.Node, b.Node) })
	if out.Served == nil {
		out.Served = []ServedCount{}
	}
	if out.SetAside == nil {
		out.SetAside = []SetAsideReplica{}
	}
	out.Hot = hotRows(answers)
	return out, nil
}

// hotRows flattens the hot sets the answering nodes report for the shards
// they lead into one row per key, by table, shard and rate (highest first).
// While leadership moves, a deposed leader that has not noticed yet may
// report a shard too: the answer with the later term (of its Raft group, or
// the chain's epoch) wins, then the higher version, as it is the current
// leader's (or closer to it).
func hotRows(answers []NodeStatus) []HotKeyRow {
	best := map[string]HotShard{}
	for _, st := range answers {
		for _, hs := range st.Hot {
			g := fmt.Sprintf("%s/%d", hs.Table, hs.Shard)
			cur, ok := best[g]
			if !ok || hs.Term > cur.Term || (hs.Term == cur.Term && hs.Version > cur.Version) {
				best[g] = hs
			}
		}
	}
	rows := []HotKeyRow{}
	for _, hs := range best {
		ids := hs.ReplicaIDs
		if ids == nil {
			ids = []string{} // JSON [] rather than null: no read replicas yet
		}
		for _, k := range hs.Keys {
			rows = append(rows, HotKeyRow{Table: hs.Table, Shard: hs.Shard, Key: k.Key, Rate: k.Rate, ReadReplicas: ids})
		}
	}
	slices.SortFunc(rows, func(a, b HotKeyRow) int {
		return cmp.Or(strings.Compare(a.Table, b.Table), cmp.Compare(a.Shard, b.Shard), cmp.Compare(b.Rate, a.Rate), cmp.Compare(a.Key, b.Key))
	})
	return rows
}

// NodeServed is one node's served pulls summed over the levels: requests
// by the role that served them, rows and refusals over all.
type NodeServed struct {
	Node                                string
	AsLeader, AsFollower, AsReadReplica uint64
	Rows, Refused                       uint64
}

// ServedByNode sums Served (sorted by node) into one row a node.
func (st ClusterStatus) ServedByNode() []NodeServed {
	var out []NodeServed
	for _, s := range st.Served {
		if len(out) == 0 || out[len(out)-1].Node != s.Node {
			out = append(out, NodeServed{Node: s.Node})
		}
		n := &out[len(out)-1]
		switch s.Role {
		case "leader":
			n.AsLeader += s.Requests
		case "follower":
			n.AsFollower += s.Requests
		case "read-replica":
			n.AsReadReplica += s.Requests
		}
		n.Rows += s.Rows
		n.Refused += s.Refused
	}
	return out
}

// Chains picks, for each chain group in Replicas (sorted by group), the
// replica with the newest configuration (highest epoch): the chain's order
// as far as its members know.
func (st ClusterStatus) Chains() []ReplicaStatus {
	var out []ReplicaStatus
	for _, r := range st.Replicas {
		if r.Replication != "chain" {
			continue
		}
		if n := len(out); n > 0 && out[n-1].Group == r.Group {
			if r.ChainEpoch > out[n-1].ChainEpoch {
				out[n-1] = r
			}
			continue
		}
		out = append(out, r)
	}
	return out
}
