package dashboard

import (
	"context"
	_ "embed"
	"encoding/json"
	"net/http"
	"time"
)

//go:embed index.html
var page []byte

// ViewFunc returns what the page shows: any value that marshals to the
// JSON the page's script reads (the node's dashboard view).
type ViewFunc func(ctx context.Context) (any, error)

// Handler serves the page at "/" and its data at "/api/cluster". Each poll
// of the page costs one status call to every node, so the view is cached
// for half a second: several open pages do not multiply the load.
func Handler(view ViewFunc) http.Handler {
	c := &cache{view: view, mu: chanMutex{ch: make(chan struct{}, 1)}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Content-Security-Policy", "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'")
		_, _ = w.Write(page)
	})
	mux.HandleFunc("GET /api/cluster", func(w http.ResponseWriter, r *http.Request) {
		b, err := c.get(r.Context())
		w.Header().Set("Cache-Control", "no-store")
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(b)
	})
	return mux
}

// cacheFor is how long one view answers every poll.
const cacheFor = 500 * time.Millisecond

type cache struct {
	view ViewFunc
	mu   chanMutex
	at   time.Time
	b    []byte
}

func (c *cache) get(ctx context.Context) ([]byte, error) {
	if err := c.mu.lock(ctx); err != nil {
		return nil, err
	}
	defer c.mu.unlock()
	if c.b != nil && time.Since(c.at) < cacheFor {
		return c.b, nil
	}
	vctx, cancel := context.WithTimeout(ctx, 4*time.Second)
	defer cancel()
	v, err := c.view(vctx)
	if err != nil {
		return nil, err
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	c.b, c.at = b, time.Now()
	return b, nil
}

// chanMutex is a mutex whose lock gives up with its context: a poll whose
// page was closed stops waiting for another poll's view.
type chanMutex struct{ ch chan struct{} }

func (m *chanMutex) lock(ctx context.Context) error {
	select {
	case m.ch <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (m *chanMutex) unlock() { <-m.ch }
