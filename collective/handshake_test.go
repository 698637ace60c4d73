package collective

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// TestHelloWire pins both kinds of hello to the bytes the wire contract
// (doc.go) gives them, and reads them back.
func TestHelloWire(t *testing.T) {
	addrs := []string{"a", "b", "c"}
	cases := []struct {
		name string
		hs   *handshake
		to   int
		want string
	}{
		{"group", groupHandshake(&Config{Rank: 2, Addrs: addrs, Job: "job", Generation: 7, ChunkBytes: 8192, SmallBytes: -1, Algorithm: Ring}), 1,
			"52505343" + "0100" + "0100" + "03000000" + "02000000" + "01000000" + "00200000" + "0700000000000000" +
				"ffffffffffffffff" + "01" + "00" + "0300" + "0300" + "0000" + "6a6f62" + "776879"},
		{"quorum", quorumHandshake(&QuorumConfig{Config: Config{Rank: 1, Addrs: addrs, Job: "job", Generation: 7}, Need: 2, Steps: 9, Initial: make([]float32, 1000)}), 0,
			"52505351" + "0100" + "0100" + "03000000" + "01000000" + "02000000" + "00000000" + "0700000000000000" +
				"0900000000000000" + "e803000000000000" + "0300" + "0300" + "00000000" + "6a6f62" + "776879"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := tc.hs.hello(tc.to, statusRefuse, "why")
			b := tc.hs.kind.marshal(&h)
			if got := hex.EncodeToString(b); got != tc.want {
				t.Fatalf("marshal:\n got %s\nwant %s", got, tc.want)
			}
			back, err := tc.hs.kind.read(bytes.NewReader(b))
			if err != nil {
				t.Fatal(err)
			}
			if back != h {
				t.Fatalf("read back %+v, want %+v", back, h)
			}
			other := &quorumHello
			if tc.hs.kind == other {
				other = &groupHello
			}
			padded := append(b, make([]byte, quorumHello.length)...) // the group's is shorter than the quorum's fixed part
			if _, err := other.read(bytes.NewReader(padded)); err == nil || !strings.Contains(err.Error(), "not a "+other.name+" handshake") {
				t.Errorf("read as %s: %v, want a magic mismatch", other.name, err)
			}
		})
	}
}

// TestJoinCancelled: a Join whose ctx is already cancelled fails with ctx's
// error and names the rank it never reached. A dialer that gives up must
// not hand Join an empty connection, which could count as a peer.
func TestJoinCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for range 20 {
		lns, addrs := listeners(t, 2)
		lns[0].Close()
		g, err := Join(ctx, Config{Rank: 1, Addrs: addrs, Listener: lns[1]})
		if g != nil || !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "no handshake with rank(s) 0") {
			t.Fatalf("Join: %v, %v; want context.Canceled naming rank 0", g, err)
		}
	}
	lns, addrs := listeners(t, 2)
	lns[0].Close()
	hs := groupHandshake(&Config{Rank: 1, Addrs: addrs, Timeout: time.Second})
	j := newJoiner(ctx, hs, lns[1])
	j.dialRank(0)
	j.wg.Wait()
	if len(j.results) != 0 {
		t.Errorf("a dialer that gave up delivered %+v", <-j.results)
	}
	j.stop()
}

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
