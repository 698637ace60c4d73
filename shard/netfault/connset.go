package netfault

import (
	"net"
	"sync"
)

// ConnSet holds open connections, each with the address it was dialed to,
// so that they can be closed together: the fault injection closes those to
// newly blocked peers, the gossip transport all of its own at shutdown.
// The zero value is an empty set.
//
// Concurrency: safe for concurrent use. A connection leaves the set when it
// is closed. A dialer that must not keep a connection once some condition
// holds (the peer blocked, the transport shut down) adds it first and checks
// the condition after: whoever sets the condition before closing the set's
// connections then either finds it in the set or is seen by that check.
type ConnSet struct {
	mu    sync.Mutex
	conns map[*setConn]struct{}
}

// setConn is a connection of a ConnSet.
type setConn struct {
	net.Conn
	s    *ConnSet
	addr string
	once sync.Once
}

func (c *setConn) Close() error {
	c.once.Do(func() {
		c.s.mu.Lock()
		delete(c.s.conns, c)
		c.s.mu.Unlock()
	})
	return c.Conn.Close()
}

// Add puts c, dialed to addr, in the set and returns the connection to use
// in its place (closing it takes it out of the set).
func (s *ConnSet) Add(c net.Conn, addr string) net.Conn {
	sc := &setConn{Conn: c, s: s, addr: addr}
	s.mu.Lock()
	if s.conns == nil {
		s.conns = map[*setConn]struct{}{}
	}
	s.conns[sc] = struct{}{}
	s.mu.Unlock()
	return sc
}

// CloseWhere closes the connections whose address match accepts (every
// connection if match is nil).
func (s *ConnSet) CloseWhere(match func(addr string) bool) {
	s.mu.Lock()
	var drop []*setConn
	for c := range s.conns {
		if match == nil || match(c.addr) {
			drop = append(drop, c)
		}
	}
	s.mu.Unlock()
	for _, c := range drop {
		c.Close()
	}
}
