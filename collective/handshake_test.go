package collective

import (
	"net"
	"sync/atomic"
	"syscall"
	"testing"
)

// failFirstReply is a listener whose first accepted connection fails its
// first write, the acceptor's handshake reply, as a reset connection would.
type failFirstReply struct {
	net.Listener
	failed atomic.Bool
}

func (l *failFirstReply) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil || !l.failed.CompareAndSwap(false, true) {
		return c, err
	}
	return &failWrite{Conn: c}, nil
}

type failWrite struct{ net.Conn }

func (c *failWrite) Write([]byte) (int, error) {
	c.Conn.Close()
	return 0, syscall.ECONNRESET
}

// TestJoinRetryAfterFailedReply: when the acceptor cannot send its reply to a
// hello, the dialer retries, and the retry is accepted: the failed attempt
// must not leave the rank counted as connected ("rank 1 is already
// connected", a refusal that ends the dialer's Join).
func TestJoinRetryAfterFailedReply(t *testing.T) {
	t.Run("group", func(t *testing.T) {
		var ln *failFirstReply
		gs := makeGroup(t, 3, func(c *Config) {
			if c.Rank == 0 {
				ln = &failFirstReply{Listener: c.Listener}
				c.Listener = ln
			}
		})
		if !ln.failed.Load() {
			t.Fatal("no reply failed: the test did not exercise the retry")
		}
		noErrors(t, onAll(gs, func(r int, g *Group) error { return g.Barrier(t.Context()) }))
	})
	t.Run("quorum", func(t *testing.T) {
		var ln *failFirstReply
		qs := joinQuorum(t, 3, 2, 2, func(c *QuorumConfig) {
			if c.Rank == 0 {
				ln = &failFirstReply{Listener: c.Listener}
				c.Listener = ln
			}
		})
		if !ln.failed.Load() {
			t.Fatal("no reply failed: the test did not exercise the retry")
		}
		var rec qRecord
		errs, _, _ := runQuorum(qs, 2, &rec, nil)
		noErrors(t, errs)
	})
}
