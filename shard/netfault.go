package shard

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

	"github.com/raftps/raftps/shard/api"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
)

// Network fault injection, for partition tests of clusters whose nodes share
// one host (raftps cluster up): they all talk over 127.0.0.1, where neither
// docker network disconnect nor a firewall rule can cut one node off. With
// NodeConfig.FaultInjection a node serves /debug/netfault on its HTTP port,
// and while it is told to block a set of peer addresses (gRPC and gossip),
// its own dialers act as if those peers were unreachable: connections to
// them are closed, new ones hang until their dial timeout (as a connect
// into a partition does), gossip packets to them are dropped and gossip
// packets from them ignored. A partition is made by telling every node on
// each side to block the other side; since every connection is dialed by
// one of its two ends, that cuts traffic both ways. Clients (which do not
// dial through a node) still reach every node: the cut-off leader stays
// reachable, which is the harder case for linearizable reads.
//
// Off by default: it is a test facility, like a failpoint build.

// errBlackholed is what a dial to a blocked peer fails with, after its timeout.
var errBlackholed = errors.New("peer unreachable: blocked by fault injection (/debug/netfault)")

// netFault is the node's set of blocked peer addresses and its open
// connections to peers. Concurrency: mu guards blocked; conns is safe on its
// own.
type netFault struct {
	mu      sync.Mutex
	blocked map[string]bool
	conns   connSet
	// delay is added to every unary call this node serves, on both
	// listeners: a slow node, one that answers, but late.
	delay atomic.Int64
}

func newNetFault() *netFault {
	return &netFault{blocked: map[string]bool{}}
}

func (f *netFault) isBlocked(addr string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.blocked[addr]
}

// set replaces the blocked set and closes connections to newly blocked peers.
func (f *netFault) set(addrs []string) {
	f.mu.Lock()
	f.blocked = map[string]bool{}
	for _, a := range addrs {
		if a != "" {
			f.blocked[a] = true
		}
	}
	f.mu.Unlock()
	f.conns.closeWhere(f.isBlocked)
}

func (f *netFault) list() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]string, 0, len(f.blocked))
	for a := range f.blocked {
		out = append(out, a)
	}
	slices.Sort(out)
	return out
}

// dial is a gRPC context dialer that honours the blocked set.
func (f *netFault) dial(ctx context.Context, addr string) (net.Conn, error) {
	if f.isBlocked(addr) {
		<-ctx.Done()
		return nil, fmt.Errorf("dial %s: %w", addr, errBlackholed)
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	fc := f.conns.add(c, addr)
	if f.isBlocked(addr) { // blocked while dialing: see connSet
		fc.Close()
		return nil, fmt.Errorf("dial %s: %w", addr, errBlackholed)
	}
	return fc, nil
}

// BlockPeers makes this node treat the peers at addrs (gRPC or gossip
// addresses) as unreachable, replacing the set it had; none unblocks every
// peer. In-process tests partition a cluster with it as raftps chaos does
// through /debug/netfault. It needs NodeConfig.FaultInjection.
func (n *Node) BlockPeers(addrs ...string) error {
	if n.fault == nil {
		return fmt.Errorf("node %s: %w: started without fault injection", n.cfg.ID, api.ErrBadRequest)
	}
	n.fault.set(addrs)
	return nil
}

// unary is the interceptor that makes a slow node slow.
func (f *netFault) unary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if d := time.Duration(f.delay.Load()); d > 0 {
		select {
		case <-time.After(d):
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
	return handler(ctx, req)
}

// unaryClient is the interceptor that makes a slow node's own calls to
// its peers late, as a slow link does (tc netem delays a container's every
// packet): with both, a slow leader's heartbeats arrive late and its lease
// runs out, as on a real slow machine.
func (f *netFault) unaryClient(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if d := time.Duration(f.delay.Load()); d > 0 {
		select {
		case <-time.After(d):
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		}
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

// SetDelay makes this node slow: every unary call it answers (client and
// peer APIs) and every unary call it makes to a peer is d late; 0 ends it.
// It needs NodeConfig.FaultInjection.
func (n *Node) SetDelay(d time.Duration) error {
	if n.fault == nil {
		return fmt.Errorf("node %s: %w: started without fault injection", n.cfg.ID, api.ErrBadRequest)
	}
	n.fault.delay.Store(int64(max(d, 0)))
	return nil
}

// serveHTTP: GET shows the blocked set and the delay; POST with
// block=ADDR,ADDR,... (empty: none) replaces the blocked set, with
// delay=DURATION (0: none) the delay.
func (f *netFault) serveHTTP(w http.ResponseWriter, r *http.Request) {
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
			f.delay.Store(int64(d))
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
		f.set(addrs)
	default:
		http.Error(w, "GET, or POST block=ADDR,... and/or delay=DURATION", http.StatusMethodNotAllowed)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]any{"blocked": f.list(), "delay": time.Duration(f.delay.Load()).String()})
}
