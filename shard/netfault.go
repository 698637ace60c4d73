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
		return fmt.Errorf("node %s: %w: started without fault injection", n.cfg.ID, ErrBadRequest)
	}
	n.fault.set(addrs)
	return nil
}

// serveHTTP: GET shows the blocked set; POST with block=ADDR,ADDR,...
// (empty: none) replaces it.
func (f *netFault) serveHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodGet:
	case http.MethodPost, http.MethodPut:
		if err := r.ParseForm(); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
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
		http.Error(w, "GET, or POST block=ADDR,...", http.StatusMethodNotAllowed)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]any{"blocked": f.list()})
}
