package client

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// clientMetrics are a client's Prometheus series (Config.Metrics): its
// pulls and pushes by table, as the caller sees them (retries, hedges and
// fan-out included).
type clientMetrics struct {
	calls   *prometheus.CounterVec
	latency *prometheus.HistogramVec
	rows    *prometheus.CounterVec
}

func newClientMetrics(reg prometheus.Registerer) (*clientMetrics, error) {
	m := &clientMetrics{
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "raftps_client_calls_total",
			Help: "Pull and Push calls of this process's raftps clients, by table and outcome (ok or error).",
		}, []string{"op", "table", "outcome"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "raftps_client_call_seconds",
			Help:    "Time of a client's Pull or Push call, retries and hedges included.",
			Buckets: prometheus.ExponentialBuckets(250e-6, 2.5, 12),
		}, []string{"op", "table"}),
		rows: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "raftps_client_rows_total",
			Help: "Rows (keys) of the client's successful Pull and Push calls.",
		}, []string{"op", "table"}),
	}
	var err error
	m.calls, err = registerOrReuse(reg, m.calls)
	if err == nil {
		m.latency, err = registerOrReuse(reg, m.latency)
	}
	if err == nil {
		m.rows, err = registerOrReuse(reg, m.rows)
	}
	return m, err
}

// registerOrReuse registers c, or returns the collector that is already
// registered in its place: several clients of one process share a registry.
func registerOrReuse[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	err := reg.Register(c)
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if old, ok := are.ExistingCollector.(C); ok {
			return old, nil
		}
	}
	return c, err
}

// observe records one call; nil m records nothing.
func (m *clientMetrics) observe(op, table string, rows int, start time.Time, err error) {
	if m == nil {
		return
	}
	outcome := "ok"
	if err != nil {
		outcome = "error"
	} else {
		m.rows.WithLabelValues(op, table).Add(float64(rows))
	}
	m.calls.WithLabelValues(op, table, outcome).Inc()
	m.latency.WithLabelValues(op, table).Observe(time.Since(start).Seconds())
}
