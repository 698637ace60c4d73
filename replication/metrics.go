package replication

import (
	"io"
	"strings"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the replication metrics of one node: what its replicas spend
// appending to their logs, applying entries and taking and installing
// snapshots. Every series is labelled by the replica's table and shard (the
// metadata group: table "_meta", shard ""), so there are as many as the
// node holds replicas; a closed replica's series are deleted (Forget).
//
// The state that can be read when scraped (role, term, indexes) is not
// here: the node reports it from its status at scrape time, at no cost to
// the write path.
type Metrics struct {
	logAppend     *prometheus.HistogramVec
	apply         *prometheus.HistogramVec
	entryPushes   *prometheus.HistogramVec
	entryRows     *prometheus.HistogramVec
	elected       *prometheus.CounterVec
	snapshots     *prometheus.CounterVec
	snapshotBytes *prometheus.CounterVec
	snapshotTime  *prometheus.HistogramVec
}

// NewMetrics registers the replication metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	labels := []string{"table", "shard"}
	// Log appends are an fsync on most disks: tens of µs on a fast NVMe
	// device, tens of ms on a busy one.
	latency := prometheus.ExponentialBuckets(50e-6, 2.5, 12)
	sizes := prometheus.ExponentialBuckets(1, 4, 10)
	m := &Metrics{
		logAppend: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "raftps_raft_log_append_seconds", Buckets: latency,
			Help: "Time to append a run of entries to a replica's Raft log, fsync included.",
		}, labels),
		apply: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "raftps_apply_seconds", Buckets: latency,
			Help: "Time to apply one committed entry (a batch of pushes) to a replica's table.",
		}, labels),
		entryPushes: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "raftps_entry_pushes", Buckets: sizes,
			Help: "Pushes per applied log entry (how much the batcher coalesced).",
		}, labels),
		entryRows: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "raftps_entry_rows", Buckets: sizes,
			Help: "Rows (keys) per applied log entry.",
		}, labels),
		elected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "raftps_raft_leader_elected_total",
			Help: "Times this replica became its group's leader; summed over the cluster, the group's leader changes.",
		}, labels),
		snapshots: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "raftps_snapshots_total",
			Help: "Snapshots a replica took (op=taken) or installed from another replica (op=installed).",
		}, []string{"table", "shard", "op"}),
		snapshotBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "raftps_snapshot_bytes_total",
			Help: "Bytes of the snapshots a replica took or installed.",
		}, []string{"table", "shard", "op"}),
		snapshotTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "raftps_snapshot_seconds", Buckets: prometheus.ExponentialBuckets(1e-3, 4, 9),
			Help: "Time to write a snapshot taken, or to install one received.",
		}, []string{"op"}),
	}
	reg.MustRegister(m.logAppend, m.apply, m.entryPushes, m.entryRows, m.elected, m.snapshots, m.snapshotBytes, m.snapshotTime)
	return m
}

// GroupLabels are the table and shard labels of the group with ID id
// ("table/shard", or the metadata group's ID).
func GroupLabels(id string) (table, shard string) {
	if t, s, ok := strings.Cut(id, "/"); ok {
		return t, s
	}
	return "_" + id, ""
}

// Group returns the metrics of the replica of group id; nil m gives nil,
// whose methods do nothing.
func (m *Metrics) Group(id string) *GroupMetrics {
	if m == nil {
		return nil
	}
	t, s := GroupLabels(id)
	return &GroupMetrics{
		m:           m,
		logAppend:   m.logAppend.WithLabelValues(t, s),
		apply:       m.apply.WithLabelValues(t, s),
		entryPushes: m.entryPushes.WithLabelValues(t, s),
		entryRows:   m.entryRows.WithLabelValues(t, s),
		elected:     m.elected.WithLabelValues(t, s),
		table:       t, shard: s,
	}
}

// Forget deletes the series of the replica of group id, once it is closed.
func (m *Metrics) Forget(id string) {
	if m == nil {
		return
	}
	t, s := GroupLabels(id)
	l := prometheus.Labels{"table": t, "shard": s}
	m.logAppend.Delete(l)
	m.apply.Delete(l)
	m.entryPushes.Delete(l)
	m.entryRows.Delete(l)
	m.elected.Delete(l)
	m.snapshots.DeletePartialMatch(l)
	m.snapshotBytes.DeletePartialMatch(l)
}

// GroupMetrics are one replica's series. A nil *GroupMetrics records nothing.
type GroupMetrics struct {
	m                                        *Metrics
	logAppend, apply, entryPushes, entryRows prometheus.Observer
	elected                                  prometheus.Counter
	table, shard                             string
}

func (g *GroupMetrics) applied(start time.Time, pushes, rows int) {
	if g == nil {
		return
	}
	g.apply.Observe(time.Since(start).Seconds())
	g.entryPushes.Observe(float64(pushes))
	g.entryRows.Observe(float64(rows))
}

func (g *GroupMetrics) becameLeader() {
	if g != nil {
		g.elected.Inc()
	}
}

// Snapshot records a snapshot taken (installed false) or installed: its
// size and how long it took.
func (g *GroupMetrics) Snapshot(installed bool, bytes int64, took time.Duration) {
	if g == nil {
		return
	}
	op := "taken"
	if installed {
		op = "installed"
	}
	g.m.snapshots.WithLabelValues(g.table, g.shard, op).Inc()
	g.m.snapshotBytes.WithLabelValues(g.table, g.shard, op).Add(float64(bytes))
	g.m.snapshotTime.WithLabelValues(op).Observe(took.Seconds())
}

// timedLogs is a raft.LogStore whose appends are timed: the fsync of a
// Raft log write is the first thing to look at when pushes slow down.
type timedLogs struct {
	raft.LogStore
	g *GroupMetrics
}

func (l timedLogs) StoreLog(e *raft.Log) error { return l.StoreLogs([]*raft.Log{e}) }

func (l timedLogs) StoreLogs(es []*raft.Log) error {
	start := time.Now()
	err := l.LogStore.StoreLogs(es)
	l.g.logAppend.Observe(time.Since(start).Seconds())
	return err
}

// countingReader counts the bytes read through it.
type countingReader struct {
	io.ReadCloser
	n int64
}

func (r *countingReader) Read(p []byte) (int, error) {
	k, err := r.ReadCloser.Read(p)
	r.n += int64(k)
	return k, err
}
