package membership

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/raftps/raftps/shard/internal/loopback"

	"github.com/hashicorp/go-hclog"
)

// blackhole returns a loopback address whose TCP connects hang, as a
// connect to a host behind a partition does: a socket listening with a
// backlog of 0 whose one queued connection is never accepted, so the kernel
// drops every further SYN.
func blackhole(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
	fill, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		t.Fatalf("filling the accept queue of %s: %v", addr, err)
	}
	t.Cleanup(func() { fill.Close() })
	if c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond); err == nil {
		c.Close()
		t.Fatalf("a connect to %s succeeded: it is no black hole", addr)
	}
	return addr
}

// connecting reports whether a TCP connect to port is in flight (a socket in
// SYN_SENT towards it, by /proc/net/tcp).
func connecting(t *testing.T, port int) bool {
	t.Helper()
	f, err := os.Open("/proc/net/tcp")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	want := fmt.Sprintf(":%04X", port)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) > 3 && strings.HasSuffix(fs[2], want) && fs[3] == "02" {
			return true
		}
	}
	return false
}

// TestMembershipCloseWithUnreachablePeer: a node whose gossip join is held
// up by a peer that never answers closes at once: a peer behind a partition
// (its connect hangs) or a frozen one (its connect succeeds, its answer
// never comes). Before, close waited for the rejoin loop's Join, which ran
// memberlist's whole TCP timeout (10 s) per such peer.
func TestMembershipCloseWithUnreachablePeer(t *testing.T) {
	for _, tc := range []struct {
		name string
		peer func(t *testing.T) (addr string, inFlight func() bool)
	}{
		{"partitioned", func(t *testing.T) (string, func() bool) {
			hole := blackhole(t)
			_, port, _ := net.SplitHostPort(hole)
			var p int
			fmt.Sscan(port, &p)
			return hole, func() bool { return connecting(t, p) }
		}},
		{"frozen", func(t *testing.T) (string, func() bool) {
			addr, taken := loopback.AcceptAll(t)
			return addr, func() bool {
				select {
				case <-taken:
					return true
				default:
					return false
				}
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			peer, inFlight := tc.peer(t)
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			addr := l.Addr().String()
			l.Close()
			cfg := Config{Addr: addr, Join: []string{peer}, RejoinInterval: time.Hour}
			m, err := New(cfg, Local{ID: "a", Addr: "127.0.0.1:1", Expect: []string{"a", "b"}, Logger: hclog.NewNullLogger()})
			if err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(5 * time.Second)
			for !inFlight() {
				if time.Now().After(deadline) {
					m.Close()
					t.Fatal("the rejoin loop never reached the peer")
				}
				time.Sleep(5 * time.Millisecond)
			}
			start := time.Now()
			if err := m.Close(); err != nil {
				t.Fatal(err)
			}
			// memberlist's TCP timeout is 10 s; Leave may take its 500 ms.
			if d := time.Since(start); d > 3*time.Second {
				t.Fatalf("close took %s: it waited for the gossip join of a peer that never answers", d.Round(time.Millisecond))
			}
		})
	}
}
