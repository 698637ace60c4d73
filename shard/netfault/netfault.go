package netfault

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
)

// ErrBlackholed is what a dial to a blocked peer fails with, after its timeout.
var ErrBlackholed = errors.New("peer unreachable: blocked by fault injection (/debug/netfault)")

// Faults is a node's set of blocked peer addresses, its open connections to
// peers and its delay. Concurrency: safe for concurrent use; mu guards
// blocked, conns and delay are safe on their own.
type Faults struct {
	mu      sync.Mutex
	blocked map[string]bool
	conns   ConnSet
	// delay is added to every unary call this node serves, on both
	// listeners: a slow node, one that answers, but late.
	delay atomic.Int64
}

// New returns a Faults that blocks nothing and delays nothing.
func New() *Faults {
	return &Faults{blocked: map[string]bool{}}
}

// Blocked reports whether the peer at addr is blocked.
func (f *Faults) Blocked(addr string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.blocked[addr]
}

// Block replaces the blocked set and closes connections to newly blocked
// peers; none unblocks every peer.
func (f *Faults) Block(addrs []string) {
	f.mu.Lock()
	f.blocked = map[string]bool{}
	for _, a := range addrs {
		if a != "" {
			f.blocked[a] = true
		}
	}
	f.mu.Unlock()
	f.conns.CloseWhere(f.Blocked)
}

// BlockedList returns the blocked set, sorted.
func (f *Faults) BlockedList() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]string, 0, len(f.blocked))
	for a := range f.blocked {
		out = append(out, a)
	}
	slices.Sort(out)
	return out
}

// SetDelay makes every unary call through the interceptors d late; 0 (or
// less) ends it.
func (f *Faults) SetDelay(d time.Duration) { f.delay.Store(int64(max(d, 0))) }

// Delay returns the delay SetDelay set.
func (f *Faults) Delay() time.Duration { return time.Duration(f.delay.Load()) }

// Dial is a gRPC context dialer that honours the blocked set.
func (f *Faults) Dial(ctx context.Context, addr string) (net.Conn, error) {
	if f.Blocked(addr) {
		<-ctx.Done()
		return nil, fmt.Errorf("dial %s: %w", addr, ErrBlackholed)
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	fc := f.conns.Add(c, addr)
	if f.Blocked(addr) { // blocked while dialing: see ConnSet
		fc.Close()
		return nil, fmt.Errorf("dial %s: %w", addr, ErrBlackholed)
	}
	return fc, nil
}

// UnaryServer is the interceptor that makes a slow node slow.
func (f *Faults) UnaryServer(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if d := f.Delay(); d > 0 {
		select {
		case <-time.After(d):
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
	return handler(ctx, req)
}

// UnaryClient is the interceptor that makes a slow node's own calls to
// its peers late, as a slow link does (tc netem delays a container's every
// packet): with both, a slow leader's heartbeats arrive late and its lease
// runs out, as on a real slow machine.
func (f *Faults) UnaryClient(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if d := f.Delay(); d > 0 {
		select {
		case <-time.After(d):
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		}
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

// ServeHTTP serves /debug/netfault: GET shows the blocked set and the delay;
// POST with block=ADDR,ADDR,... (empty: none) replaces the blocked set, with
// delay=DURATION (0: none) the delay.
func (f *Faults) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodGet:
	case http.MethodPost, http.MethodPut:
		if err := r.ParseForm(); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if r.Form.Has("delay") {
			d, err := time.ParseDuration(r.Form.Get("delay"))
			if err != nil || d < 0 {
				http.Error(w, fmt.Sprintf("delay: %q is not a duration >= 0", r.Form.Get("delay")), http.StatusBadRequest)
				return
			}
			f.SetDelay(d)
			if !r.Form.Has("block") {
				break
			}
		}
		var addrs []string
		for _, a := range strings.Split(r.Form.Get("block"), ",") {
			if a = strings.TrimSpace(a); a != "" {
				if _, _, err := net.SplitHostPort(a); err != nil {
					http.Error(w, fmt.Sprintf("block: %q is not host:port", a), http.StatusBadRequest)
					return
				}
				addrs = append(addrs, a)
			}
		}
		f.Block(addrs)
	default:
		http.Error(w, "GET, or POST block=ADDR,... and/or delay=DURATION", http.StatusMethodNotAllowed)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]any{"blocked": f.BlockedList(), "delay": f.Delay().String()})
}
