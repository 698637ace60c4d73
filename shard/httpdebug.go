package shard

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"strconv"
	"time"

	"github.com/raftps/raftps/shard/dashboard"
)

// maxProfileSeconds caps /debug/pprof/profile's and /trace's seconds: an
// uncapped request (seconds=86400) holds the HTTP port for a day.
const maxProfileSeconds = 60

// httpListenAddr is where the HTTP port listens: addr, or 127.0.0.1 at
// its port when addr names no host (":7101"). /healthz and /metrics are
// readable by anyone who reaches the port; an operator who wants them on
// the network says so with a host.
func httpListenAddr(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host != "" {
		return addr
	}
	return net.JoinHostPort("127.0.0.1", port)
}

// servePprof adds the pprof handlers (NodeConfig.Pprof), with the
// profile's and trace's seconds capped.
func servePprof(mux *http.ServeMux) {
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.Handle("/debug/pprof/profile", capSeconds(http.HandlerFunc(pprof.Profile)))
	mux.Handle("/debug/pprof/trace", capSeconds(http.HandlerFunc(pprof.Trace)))
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
}

// capSeconds refuses a seconds parameter over maxProfileSeconds.
func capSeconds(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s := r.URL.Query().Get("seconds"); s != "" {
			if v, err := strconv.ParseFloat(s, 64); err != nil || v > maxProfileSeconds {
				http.Error(w, "seconds must be a number up to "+strconv.Itoa(maxProfileSeconds), http.StatusBadRequest)
				return
			}
		}
		h.ServeHTTP(w, r)
	})
}

// startHTTP serves the HTTP port (NodeConfig.HTTPAddr).
func (n *Node) startHTTP() error {
	lis, err := net.Listen("tcp", httpListenAddr(n.cfg.HTTPAddr))
	if err != nil {
		return fmt.Errorf("node %s: http: %w", n.cfg.ID, err)
	}
	mux := http.NewServeMux()
	if n.cfg.Pprof {
		servePprof(mux)
	}
	n.serveNetFault(mux)
	if !n.cfg.NoMetrics {
		mux.Handle("/metrics", n.metrics.Handler())
	}
	mux.Handle("/", dashboard.Handler(n.dashboardView))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if addr, _ := n.meta.Raft.LeaderWithID(); addr == "" {
			http.Error(w, "no metadata leader", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	n.http = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	n.wg.Go(func() {
		if err := n.http.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			n.log.Error("http server stopped", "error", err)
		}
	})
	return nil
}
