package membership

import (
	"context"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/raftps/raftps/shard/netfault"
)

// gossipTransport is every node's memberlist transport: memberlist's own
// NetTransport, with two changes.
//
// Its stream dials, and the streams they opened, end when it shuts down.
// memberlist dials from Join, which the membership's rejoin loop runs and
// Membership.Close (so the node's Close) waits for, and bounds the dial and the exchange on the stream
// only by its TCPTimeout (10 s on a LAN): a peer behind a partition (SYNs
// unanswered) or a frozen one (the kernel accepts, nobody answers) held
// Close for 10 s per such peer.
//
// With fault injection (f set: Local.Faults) it applies the blocked set:
// packets to blocked peers are lost, packets from them ignored (a gossip
// packet comes from its sender's gossip address), stream dials to them hang
// until their timeout. Incoming streams cannot be told apart by sender
// (they come from ephemeral ports); the blocked peer's own transport does
// not open them.
//
// It embeds the Transport interface, not *NetTransport, so that memberlist
// does not find NetTransport's DialAddressTimeout and dial around it: it
// wraps this transport in its shim, whose dials come here.
type gossipTransport struct {
	memberlist.Transport
	f       *netfault.Faults        // nil: no fault injection
	packets chan *memberlist.Packet // filtered packets, if f is set
	ctx     context.Context         // done at Shutdown: ends dials
	cancel  context.CancelFunc
	done    chan struct{} // closed at Shutdown: ends the filter
	once    sync.Once

	conns netfault.ConnSet // the streams it dialed that are still open
}

func newGossipTransport(t memberlist.Transport, f *netfault.Faults) *gossipTransport {
	ctx, cancel := context.WithCancel(context.Background())
	gt := &gossipTransport{Transport: t, f: f, ctx: ctx, cancel: cancel, done: make(chan struct{})}
	if f != nil {
		gt.packets = make(chan *memberlist.Packet)
		go gt.filter()
	}
	return gt
}

func (t *gossipTransport) filter() {
	in := t.Transport.PacketCh()
	for {
		select {
		case <-t.done:
			return
		case p := <-in:
			if p.From != nil && t.f.Blocked(p.From.String()) {
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

func (t *gossipTransport) PacketCh() <-chan *memberlist.Packet {
	if t.f == nil {
		return t.Transport.PacketCh()
	}
	return t.packets
}

func (t *gossipTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	if t.f != nil && t.f.Blocked(addr) {
		return time.Now(), nil
	}
	return t.Transport.WriteTo(b, addr)
}

func (t *gossipTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	if t.f != nil && t.f.Blocked(addr) {
		// Hang as a dial into a black hole does, but not past shutdown.
		select {
		case <-time.After(timeout):
		case <-t.ctx.Done():
		}
		return nil, fmt.Errorf("gossip dial %s: %w", addr, netfault.ErrBlackholed)
	}
	d := net.Dialer{Timeout: timeout}
	c, err := d.DialContext(t.ctx, "tcp", addr)
	if err != nil {
		if t.ctx.Err() != nil {
			return nil, fmt.Errorf("gossip dial %s: transport shut down: %w", addr, err)
		}
		return nil, err
	}
	gc := t.conns.Add(c, addr)
	if t.ctx.Err() != nil { // shut down while dialing: see netfault.ConnSet
		gc.Close()
		return nil, fmt.Errorf("gossip dial %s: transport shut down", addr)
	}
	return gc, nil
}

// Shutdown ends the dials in flight and closes the streams they opened, then
// shuts the wrapped transport down, then stops filtering (done, apart from
// ctx for that reason). The wrapped transport goes before the filter:
// memberlist shuts its transport down while its own packet handler still
// reads (so that the transport's listeners can finish), and the wrapped
// transport's UDP listener waits to hand over a packet it has read.
// Stopping the filter first left that listener blocked for ever, and
// Shutdown (so Membership.Close) waiting for it.
func (t *gossipTransport) Shutdown() error {
	t.cancel()
	t.conns.CloseWhere(nil)
	err := t.Transport.Shutdown()
	t.once.Do(func() { close(t.done) })
	return err
}
