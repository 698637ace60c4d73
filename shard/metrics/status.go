package metrics

import (
	"context"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/raftps/raftps/shard/shardpb"
)

// StatusFunc returns the node's own status (what `raftps status` asks it
// for, without checksums).
type StatusFunc func(ctx context.Context) (*shardpb.StatusResponse, error)

// StatusCollector turns a node's status into gauges and counters when
// scraped: the state of every replica it holds, its view of the cluster,
// its hot keys and the pulls it served. Reading it costs the scrape, not
// the request paths.
type StatusCollector struct {
	status StatusFunc
}

// NewStatusCollector returns a collector of status (whose load holds the
// node's disk).
func NewStatusCollector(status StatusFunc) *StatusCollector {
	return &StatusCollector{status: status}
}

var (
	replicaLabels = []string{"table", "shard"}

	descRole        = prometheus.NewDesc("raftps_replica_role", "1 for the role a replica holds now: leader, follower, candidate or dormant (Raft; dormant: a follower of a group with no leader until a request needs one); head, middle, tail or none (chain).", []string{"table", "shard", "replication", "role"}, nil)
	descTerm        = prometheus.NewDesc("raftps_raft_term", "A replica's current Raft term (chain replicas: their configuration epoch).", replicaLabels, nil)
	descCommit      = prometheus.NewDesc("raftps_commit_index", "A replica's commit index (chain: what it knows the tail has applied).", replicaLabels, nil)
	descApplied     = prometheus.NewDesc("raftps_applied_index", "The last log index a replica applied to its table.", replicaLabels, nil)
	descLast        = prometheus.NewDesc("raftps_last_index", "The last index in a replica's log.", replicaLabels, nil)
	descRows        = prometheus.NewDesc("raftps_replica_rows", "Rows a replica's table holds.", replicaLabels, nil)
	descMem         = prometheus.NewDesc("raftps_replica_memory_bytes", "Memory a replica's table holds (rows and optimizer state).", replicaLabels, nil)
	descNodeRepl    = prometheus.NewDesc("raftps_node_replicas", "Shard replicas this node holds (the metadata group's not counted).", nil, nil)
	descNodeLeaders = prometheus.NewDesc("raftps_node_leaders", "Shard groups this node leads (chains: heads).", nil, nil)
	descNodeQuiet   = prometheus.NewDesc("raftps_node_quiet_replicas", "Shard replicas of this node on their group's quiet timing (idle groups, --quiesce-after).", nil, nil)
	descNodeDormant = prometheus.NewDesc("raftps_node_dormant_replicas", "Shard replicas of this node whose group is dormant: no leader until a request needs one (--dormant-after).", nil, nil)
	descMetaLeader  = prometheus.NewDesc("raftps_meta_leader", "1 on the node that leads the metadata group: its cluster gauges are the authoritative ones.", nil, nil)
	descMembers     = prometheus.NewDesc("raftps_cluster_members", "Nodes by gossip state (alive, suspect, dead) as this node sees them.", []string{"state"}, nil)
	descUnder       = prometheus.NewDesc("raftps_cluster_under_replicated_shards", "Shards with fewer live replicas than their table asks for, as this node sees them.", nil, nil)
	descMoving      = prometheus.NewDesc("raftps_cluster_moving_shards", "Shards gaining a replica (a repair or rebalance in progress).", nil, nil)
	descMapVersion  = prometheus.NewDesc("raftps_cluster_map_version", "The cluster map version this node has applied.", nil, nil)
	descJobs        = prometheus.NewDesc("raftps_jobs", "Trainer jobs the cluster knows.", nil, nil)
	descHotKeys     = prometheus.NewDesc("raftps_hot_keys", "Hot keys of a shard this node leads.", replicaLabels, nil)
	descHotCopies   = prometheus.NewDesc("raftps_hot_read_replicas", "Read replicas (nodes holding copies of its hot keys) of a shard this node leads.", replicaLabels, nil)
	descServed      = prometheus.NewDesc("raftps_pulls_served_total", "Pulls this node served, by the role it served them in (leader, follower, read-replica) and the level asked.", []string{"role", "level"}, nil)
	descServedRows  = prometheus.NewDesc("raftps_pull_rows_served_total", "Rows of the pulls this node served, by role and level.", []string{"role", "level"}, nil)
	descStale       = prometheus.NewDesc("raftps_pulls_refused_stale_total", "Pulls this node refused as too stale for their bound (the client went elsewhere), by role and level.", []string{"role", "level"}, nil)
	descDiskFree    = prometheus.NewDesc("raftps_disk_free_bytes", "Bytes free to the node on its data dir's file system.", nil, nil)
	descDiskSize    = prometheus.NewDesc("raftps_disk_size_bytes", "Size of the data dir's file system.", nil, nil)
	descDiskFull    = prometheus.NewDesc("raftps_disk_full", "1 while the node refuses pushes because its data disk is below its minimum free space (--disk-min-free-mib).", nil, nil)
	descDiskMin     = prometheus.NewDesc("raftps_disk_min_free_bytes", "The free space below which the node refuses pushes.", nil, nil)
	descSetAside    = prometheus.NewDesc("raftps_set_aside_replicas", "Replicas this node set aside since it started because their files failed their checks at open.", nil, nil)
	descScrapeOK    = prometheus.NewDesc("raftps_status_up", "1 if the node's status could be read for this scrape.", nil, nil)
)

// Describe sends nothing: the collector is unchecked, as its series come
// and go with the replicas the node holds.
func (c *StatusCollector) Describe(chan<- *prometheus.Desc) {}

// Collect reads the status and sends its series.
func (c *StatusCollector) Collect(ch chan<- prometheus.Metric) {
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, labels...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := c.status(ctx)
	if err != nil {
		gauge(descScrapeOK, 0)
		return
	}
	gauge(descScrapeOK, 1)
	// The status carries the node's load, its disk included (Registry.Load):
	// not read a second time here.
	if l := st.Load; l != nil && l.DiskSizeBytes > 0 {
		gauge(descDiskFree, float64(l.DiskFreeBytes))
		gauge(descDiskSize, float64(l.DiskSizeBytes))
	}
	var replicas, leaders, quiet, dormant, metaLeader float64
	for _, r := range st.Replicas {
		table, shard := r.Table, strconv.Itoa(int(r.Shard))
		if r.Group == "meta" {
			table, shard = "_meta", ""
			if r.State == "leader" {
				metaLeader = 1
			}
		} else {
			replicas++
			if r.State == "leader" {
				leaders++
			}
			if r.Quiet {
				quiet++
			}
			if r.Dormant {
				dormant++
			}
		}
		repl, role := "raft", r.State
		if r.Dormant && r.State == "follower" {
			// No leader by design until a request needs one: the
			// no-leader alert must not page for it.
			role = "dormant"
		}
		if r.Replication == "chain" {
			repl, role = "chain", r.ChainRole
		}
		gauge(descRole, 1, table, shard, repl, role)
		term := r.Term
		if repl == "chain" {
			term = r.ChainEpoch
		}
		gauge(descTerm, float64(term), table, shard)
		gauge(descCommit, float64(r.CommitIndex), table, shard)
		gauge(descApplied, float64(r.AppliedIndex), table, shard)
		gauge(descLast, float64(r.LastIndex), table, shard)
		if r.Group != "meta" {
			gauge(descRows, float64(r.Rows), table, shard)
			gauge(descMem, float64(r.MemoryBytes), table, shard)
		}
	}
	gauge(descNodeRepl, replicas)
	gauge(descNodeLeaders, leaders)
	gauge(descNodeQuiet, quiet)
	gauge(descNodeDormant, dormant)
	gauge(descMetaLeader, metaLeader)
	states := map[string]float64{"alive": 0, "suspect": 0, "dead": 0}
	for _, nd := range st.Nodes {
		states[nd.State]++
	}
	for _, s := range []string{"alive", "suspect", "dead"} {
		gauge(descMembers, states[s], s)
	}
	if d := st.Disk; d != nil {
		full := 0.0
		if d.Full {
			full = 1
		}
		gauge(descDiskFull, full)
		gauge(descDiskMin, float64(d.MinFreeBytes))
	}
	gauge(descSetAside, float64(len(st.SetAside)))
	gauge(descUnder, float64(st.UnderReplicated))
	gauge(descMoving, float64(len(st.Moving)))
	gauge(descMapVersion, float64(st.MapVersion))
	gauge(descJobs, float64(len(st.Jobs)))
	for _, h := range st.Hot {
		shard := strconv.Itoa(int(h.Shard))
		gauge(descHotKeys, float64(len(h.Keys)), h.Table, shard)
		gauge(descHotCopies, float64(len(h.ReplicaIds)), h.Table, shard)
	}
	for _, s := range st.Served {
		counter(descServed, float64(s.Requests), s.Role, s.Level)
		counter(descServedRows, float64(s.Rows), s.Role, s.Level)
		counter(descStale, float64(s.Refused), s.Role, s.Level)
	}
}
