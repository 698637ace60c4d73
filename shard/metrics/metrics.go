package metrics

import (
	"context"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/raftps/raftps/replication"
	"github.com/raftps/raftps/shard/shardpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Registry holds one node's metrics. Each node has its own (several nodes
// share a process in tests), so nothing here uses Prometheus's default
// registry.
type Registry struct {
	reg *prometheus.Registry
	// Replication is handed to every replica the node opens.
	Replication *replication.Metrics

	requests *prometheus.CounterVec
	latency  *prometheus.HistogramVec
	rows     *prometheus.CounterVec
	refused  *prometheus.CounterVec
	steps    *prometheus.CounterVec
	load     load
}

// New returns a registry with the Go runtime and process collectors and
// the node's request, replication and scheduler metrics.
func New() *Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	r := &Registry{
		reg:         reg,
		Replication: replication.NewMetrics(reg),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "raftps_requests_total",
			Help: "Client API calls this node answered, by method, table and gRPC code (a batch counts once, table \"\").",
		}, []string{"rpc", "table", "code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "raftps_request_duration_seconds",
			Help:    "Server-side time of client API calls, by method and table.",
			Buckets: loadBounds,
		}, []string{"rpc", "table"}),
		rows: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "raftps_rows_total",
			Help: "Rows served by pulls (op=pull) and applied-or-acknowledged by pushes (op=push) on this node, by table; batch parts count by their own table.",
		}, []string{"op", "table"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "raftps_requests_refused_total",
			Help: "Client API calls or batch parts refused, by method and error reason (NOT_LEADER, TOO_STALE, REQUEST_TOO_LARGE, ...).",
		}, []string{"rpc", "reason"}),
		steps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "raftps_scheduler_steps_total",
			Help: "Placement changes this node decided as metadata leader, by kind (repair, rebalance, drain, leader-balance) and outcome.",
		}, []string{"kind", "outcome"}),
	}
	reg.MustRegister(r.requests, r.latency, r.rows, r.refused, r.steps)
	return r
}

// MustRegister registers more collectors (the node's status collector).
func (r *Registry) MustRegister(cs ...prometheus.Collector) { r.reg.MustRegister(cs...) }

// Gatherer is what /metrics serves.
func (r *Registry) Gatherer() prometheus.Gatherer { return r.reg }

// Handler serves the registry in the Prometheus text format.
func (r *Registry) Handler() http.Handler {
	return promhttp.HandlerFor(r.reg, promhttp.HandlerOpts{ErrorLog: nil, Registry: r.reg})
}

// Step counts one scheduler step of kind ("repair", "rebalance", ...)
// with its outcome ("ok" or "failed").
func (r *Registry) Step(kind string, err error) {
	if r == nil {
		return
	}
	outcome := "ok"
	if err != nil {
		outcome = "failed"
	}
	r.steps.WithLabelValues(kind, outcome).Inc()
}

// UnaryServerInterceptor records every client API call: its count by code,
// its latency, the rows it moved and, if refused, why. It reads only the
// request and answer, so the handlers know nothing of it.
func (r *Registry) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		start := time.Now()
		resp, err := handler(ctx, req)
		rpc := info.FullMethod[strings.LastIndexByte(info.FullMethod, '/')+1:]
		table := ""
		if t, ok := req.(interface{ GetTable() string }); ok {
			table = t.GetTable()
		}
		st, _ := status.FromError(err)
		took := time.Since(start).Seconds()
		r.requests.WithLabelValues(rpc, table, st.Code().String()).Inc()
		r.latency.WithLabelValues(rpc, table).Observe(took)
		r.load.call(rpc, took)
		if err != nil {
			r.refused.WithLabelValues(rpc, reasonOf(st)).Inc()
			return resp, err
		}
		r.countRows(rpc, req, resp)
		return resp, err
	}
}

func (r *Registry) countRows(rpc string, req, resp any) {
	switch q := req.(type) {
	case *shardpb.PullRequest:
		r.addRows("pull", q.Table, len(q.Keys)/8)
	case *shardpb.PushRequest:
		r.addRows("push", q.Table, len(q.Keys)/8)
	case *shardpb.PullBatchRequest:
		a, _ := resp.(*shardpb.PullBatchResponse)
		for i, p := range q.Parts {
			if r.partOK(rpc, a.GetErrors(), i) {
				r.addRows("pull", p.Table, len(p.Keys)/8)
			}
		}
	case *shardpb.PushBatchRequest:
		a, _ := resp.(*shardpb.PushBatchResponse)
		for i, p := range q.Parts {
			if r.partOK(rpc, a.GetErrors(), i) {
				r.addRows("push", p.Table, len(p.Keys)/8)
			}
		}
	}
}

func (r *Registry) addRows(op, table string, n int) {
	r.rows.WithLabelValues(op, table).Add(float64(n))
	if op == "pull" {
		r.load.pullRows.Add(uint64(n))
	} else {
		r.load.pushRows.Add(uint64(n))
	}
}

// partOK reports whether part i of a batch succeeded, and counts its
// refusal if not.
func (r *Registry) partOK(rpc string, errs []*shardpb.PartError, i int) bool {
	if i >= len(errs) || errs[i].GetCode() == uint32(codes.OK) {
		return true
	}
	reason := errs[i].GetInfo().GetReason()
	if reason == "" {
		reason = codes.Code(errs[i].GetCode()).String()
	}
	r.refused.WithLabelValues(rpc, reason).Inc()
	return false
}

// reasonOf is the error reason a node put in st's details, else its code.
func reasonOf(st *status.Status) string {
	for _, d := range st.Details() {
		if info, ok := d.(*shardpb.ErrorInfo); ok && info.Reason != "" {
			return info.Reason
		}
	}
	return st.Code().String()
}
