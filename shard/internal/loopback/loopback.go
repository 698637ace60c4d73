package loopback

import (
	"net"
	"testing"
)

// AcceptAll listens on a loopback port and takes every connection, never
// reading from it (as a frozen process does: the kernel completes the
// handshake); the channel gets each one taken, while it has room. The
// listener and the connections close when the test ends.
func AcceptAll(t testing.TB) (string, <-chan net.Conn) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lis.Close() })
	accepted := make(chan net.Conn, 16)
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() })
			select {
			case accepted <- c:
			default:
			}
		}
	}()
	return lis.Addr().String(), accepted
}
