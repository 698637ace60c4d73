package auth

import (
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/raftps/raftps/shard/certs/certstest"
	"google.golang.org/grpc/credentials"
)

// countingConn counts the writes that reach the socket.
type countingConn struct {
	net.Conn
	writes atomic.Int64
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// tlsPair is a TLS connection over real loopback TCP between creds on both
// ends, with the client's and the server's socket writes counted.
func tlsPair(t *testing.T, wrap func(credentials.TransportCredentials) credentials.TransportCredentials) (client, server net.Conn, cRaw, sRaw *countingConn) {
	t.Helper()
	d := certstest.New(t)
	f := d.Node("n1")
	kp, err := tls.LoadX509KeyPair(f.Cert, f.Key)
	if err != nil {
		t.Fatal(err)
	}
	sCreds := wrap(credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{kp}}))
	cCreds := wrap(credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true}))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type result struct {
		conn net.Conn
		raw  *countingConn
		err  error
	}
	done := make(chan result, 1)
	go func() {
		raw, err := ln.Accept()
		if err != nil {
			done <- result{err: err}
			return
		}
		cr := &countingConn{Conn: raw}
		conn, _, err := sCreds.ServerHandshake(cr)
		done <- result{conn, cr, err}
	}()
	raw, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	cRaw = &countingConn{Conn: raw}
	client, _, err = cCreds.ClientHandshake(context.Background(), ln.Addr().String(), cRaw)
	if err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	t.Cleanup(func() { client.Close(); r.conn.Close() })
	return client, r.conn, cRaw, r.raw
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*7)
	}
	return b
}

// TestCoalescedWritesOnce: a 256 KiB write through coalesced TLS credentials
// (what gRPC's buffer hands its connection) reaches the socket as one write,
// on the dialing and the accepting side, and arrives intact; plain TLS
// writes it a record (16 KiB) at a time.
func TestCoalescedWritesOnce(t *testing.T) {
	const n = 256 << 10
	for _, tc := range []struct {
		name      string
		wrap      func(credentials.TransportCredentials) credentials.TransportCredentials
		maxWrites int64
	}{
		{"coalesced", Coalesced, 1},
		{"plain", func(c credentials.TransportCredentials) credentials.TransportCredentials { return c }, 1 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client, server, cRaw, sRaw := tlsPair(t, tc.wrap)
			for _, dir := range []struct {
				name     string
				from, to net.Conn
				raw      *countingConn
			}{{"client to server", client, server, cRaw}, {"server to client", server, client, sRaw}} {
				msg := pattern(n, byte(len(dir.name)))
				before := dir.raw.writes.Load()
				go func() { dir.from.Write(msg) }()
				got := make([]byte, n)
				if _, err := io.ReadFull(dir.to, got); err != nil {
					t.Fatalf("%s: %v", dir.name, err)
				}
				if !bytes.Equal(got, msg) {
					t.Fatalf("%s: the bytes read differ from those written", dir.name)
				}
				writes := dir.raw.writes.Load() - before
				if writes > tc.maxWrites {
					t.Fatalf("%s: %d socket writes for one %d-byte write, want at most %d", dir.name, writes, n, tc.maxWrites)
				}
				if tc.maxWrites > 1 && writes < n/(16<<10) {
					t.Fatalf("%s: plain TLS made %d socket writes; the count is not what the test thinks", dir.name, writes)
				}
			}
		})
	}
}

// TestCoalescedConcurrentWriters: writers of one connection each get their
// whole write through, none interleaved with another's, and what TLS writes
// outside a Write (here the close_notify alert) still goes out after them.
func TestCoalescedConcurrentWriters(t *testing.T) {
	client, server, _, _ := tlsPair(t, Coalesced)
	const writers, each, block = 4, 20, 48 << 10
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for range each {
				if _, err := client.Write(bytes.Repeat([]byte{byte('a' + w)}, block)); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	go func() { wg.Wait(); client.Close() }()
	got, err := io.ReadAll(server)
	if err != nil {
		t.Fatalf("reading until the client's close_notify: %v", err)
	}
	if len(got) != writers*each*block {
		t.Fatalf("read %d bytes, want %d", len(got), writers*each*block)
	}
	counts := map[byte]int{}
	for off := 0; off < len(got); off += block {
		b := got[off : off+block]
		if bytes.Count(b, b[:1]) != block {
			t.Fatalf("block at %d mixes writers' bytes", off)
		}
		counts[b[0]]++
	}
	for w := range writers {
		if counts[byte('a'+w)] != each {
			t.Fatalf("writer %d: %d blocks arrived, want %d", w, counts[byte('a'+w)], each)
		}
	}
}

// TestCoalescedWriteFails: a write whose socket is gone reports the error
// instead of the bytes TLS thought it had written, and so does every later
// write.
func TestCoalescedWriteFails(t *testing.T) {
	client, _, cRaw, _ := tlsPair(t, Coalesced)
	cRaw.Conn.Close()
	if n, err := client.Write(pattern(100<<10, 1)); err == nil || n != 0 {
		t.Fatalf("write over a closed socket: %d, %v; want 0 and an error", n, err)
	}
	if _, err := client.Write([]byte("again")); err == nil {
		t.Fatal("a later write succeeded")
	}
}

// TestCoalescedCloseDuringStuckWrite: a write stuck because the peer stopped
// reading (a paused node) holds the records it flushes; Close must not wait
// for it (gRPC fails the connection's calls only once Close returns), and
// the stuck write must end with an error.
func TestCoalescedCloseDuringStuckWrite(t *testing.T) {
	client, _, cRaw, _ := tlsPair(t, Coalesced) // the server never reads
	msg := pattern(1<<20, 3)
	wrote := make(chan error, 1)
	go func() {
		for {
			if _, err := client.Write(msg); err != nil {
				wrote <- err
				return
			}
		}
	}()
	// Wait until the socket's buffers are full and the writes stop.
	for last := int64(-1); ; {
		time.Sleep(200 * time.Millisecond)
		n := cRaw.writes.Load()
		if n == last {
			break
		}
		last = n
	}
	start := time.Now()
	if err := client.Close(); err != nil {
		t.Logf("close: %v", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("Close took %v behind a stuck write, want it at once", d)
	}
	select {
	case err := <-wrote:
		if err == nil {
			t.Fatal("the stuck write succeeded")
		}
	case <-time.After(2 * time.Second):
		t.Fatal("the stuck write did not end after Close")
	}
}
