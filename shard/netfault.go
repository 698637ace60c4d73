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
	"time"

	"github.com/hashicorp/memberlist"
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
// connections to peers. Concurrency: mu guards blocked and conns.
type netFault struct {
	mu      sync.Mutex
	blocked map[string]bool
	conns   map[*faultConn]bool
}

func newNetFault() *netFault {
	return &netFault{blocked: map[string]bool{}, conns: map[*faultConn]bool{}}
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
	var drop []*faultConn
	for c := range f.conns {
		if f.blocked[c.addr] {
			drop = append(drop, c)
		}
	}
	f.mu.Unlock()
	for _, c := range drop {
		c.Close()
	}
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
	fc := &faultConn{Conn: c, f: f, addr: addr}
	f.mu.Lock()
	blocked := f.blocked[addr]
	if !blocked {
		f.conns[fc] = true
	}
	f.mu.Unlock()
	if blocked { // blocked while dialing
		c.Close()
		return nil, fmt.Errorf("dial %s: %w", addr, errBlackholed)
	}
	return fc, nil
}

// faultConn is a peer connection the netFault can close.
type faultConn struct {
	net.Conn
	f    *netFault
	addr string
	once sync.Once
}

func (c *faultConn) Close() error {
	c.once.Do(func() {
		c.f.mu.Lock()
		delete(c.f.conns, c)
		c.f.mu.Unlock()
	})
	return c.Conn.Close()
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

// faultTransport is memberlist's network transport with the blocked set
// applied: packets to blocked peers are lost, packets from them ignored
// (a gossip packet comes from its sender's gossip address), stream dials
// to them hang until their timeout. Incoming streams cannot be told apart
// by sender (they come from ephemeral ports); the blocked peer's own
// transport does not open them.
type faultTransport struct {
	memberlist.Transport
	f       *netFault
	packets chan *memberlist.Packet
	done    chan struct{}
	once    sync.Once
}

func newFaultTransport(t memberlist.Transport, f *netFault) *faultTransport {
	ft := &faultTransport{Transport: t, f: f, packets: make(chan *memberlist.Packet), done: make(chan struct{})}
	go ft.filter()
	return ft
}

func (t *faultTransport) filter() {
	in := t.Transport.PacketCh()
	for {
		select {
		case <-t.done:
			return
		case p := <-in:
			if p.From != nil && t.f.isBlocked(p.From.String()) {
				continue
			}
			select {
			case t.packets <- p:
			case <-t.done:
				return
			}
		}
	}
}

func (t *faultTransport) PacketCh() <-chan *memberlist.Packet { return t.packets }

func (t *faultTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	if t.f.isBlocked(addr) {
		return time.Now(), nil
	}
	return t.Transport.WriteTo(b, addr)
}

func (t *faultTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	if t.f.isBlocked(addr) {
		// Hang as a dial into a black hole does, but not past the
		// transport's shutdown: memberlist dials from Join, which the
		// membership's rejoin loop runs and Node.Close waits for.
		select {
		case <-time.After(timeout):
		case <-t.done:
		}
		return nil, fmt.Errorf("gossip dial %s: %w", addr, errBlackholed)
	}
	return t.Transport.DialTimeout(addr, timeout)
}

// Shutdown shuts the wrapped transport down before it stops filtering:
// memberlist shuts its transport down while its own packet handler still
// reads (so that the transport's listeners can finish), and the wrapped
// transport's UDP listener waits to hand over a packet it has read. Stopping
// the filter first left that listener blocked for ever, and Shutdown (so
// Node.Close) waiting for it.
func (t *faultTransport) Shutdown() error {
	err := t.Transport.Shutdown()
	t.once.Do(func() { close(t.done) })
	return err
}
