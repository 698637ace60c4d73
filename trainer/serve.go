package trainer

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// ServeMetrics serves a fresh registry, with the Go runtime and process
// collectors, at http://addr/metrics until stop is called (what raftps
// train --metrics-addr serves). It returns the registry for the caller's
// own metrics (JobConfig.Metrics, the client's Config.Metrics).
func ServeMetrics(addr string, stderr io.Writer) (reg *prometheus.Registry, stop func(), err error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, nil, fmt.Errorf("metrics address: %w", err)
	}
	reg = prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Fprintf(stderr, "metrics server stopped: %v\n", err)
		}
	}()
	fmt.Fprintf(stderr, "serving metrics at http://%s/metrics\n", lis.Addr())
	return reg, func() { _ = srv.Close() }, nil
}

// MetricsAddr is the metrics address of the trainer of rank k when rank 0
// serves at addr: its port raised by k (port 0 stays 0), so the trainers
// of one machine serve side by side.
func MetricsAddr(addr string, k int) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("metrics address %q: %w", addr, err)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 0 || p+k > 65535 {
		return "", fmt.Errorf("metrics address %q: bad port for rank %d", addr, k)
	}
	if p == 0 {
		return addr, nil
	}
	return net.JoinHostPort(host, strconv.Itoa(p+k)), nil
}
