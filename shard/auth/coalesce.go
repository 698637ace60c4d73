package auth

import (
	"context"
	"net"
	"sync"

	"google.golang.org/grpc/credentials"
)

// Coalesced wraps TLS transport credentials so that the records of one
// Write reach the socket in one write. crypto/tls writes each record (at
// most 16 KiB) with a write of its own, and gRPC hands it up to 256 KiB at
// a time (grpcopt's buffers); on loopback and small VMs the kernel's cost
// is per write and per segment more than per byte, so sixteen writes of a
// record each cost far more than one (docs/BENCHMARKS.md, "TLS records
// written together").
func Coalesced(c credentials.TransportCredentials) credentials.TransportCredentials {
	return coalescedCreds{c}
}

type coalescedCreds struct {
	credentials.TransportCredentials
}

func (c coalescedCreds) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	b := &batchConn{Conn: raw}
	conn, info, err := c.TransportCredentials.ClientHandshake(ctx, authority, b)
	if err != nil {
		return nil, nil, err
	}
	return &flushConn{Conn: conn, raw: b}, info, nil
}

func (c coalescedCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	b := &batchConn{Conn: raw}
	conn, info, err := c.TransportCredentials.ServerHandshake(b)
	if err != nil {
		return nil, nil, err
	}
	return &flushConn{Conn: conn, raw: b}, info, nil
}

func (c coalescedCreds) Clone() credentials.TransportCredentials {
	return coalescedCreds{c.TransportCredentials.Clone()}
}

// flushConn is the TLS connection gRPC writes to: during its Write the
// records TLS writes below it are held, and sent together when it returns.
type flushConn struct {
	net.Conn // the TLS connection
	raw      *batchConn
	mu       sync.Mutex // one Write at a time holds the batch
}

func (f *flushConn) Write(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.raw.hold()
	n, err := f.Conn.Write(p)
	if ferr := f.raw.release(); err == nil && ferr != nil {
		n, err = 0, ferr
	}
	return n, err
}

// Close sends TLS's close_notify, unless a write is in flight: it may be
// stuck on a peer that stopped reading (a paused node), holding what it
// flushes, and gRPC fails the connection's calls only once Close returns.
// Then, as tls.Conn does when Close meets one of its own writes, the
// socket is closed under it at once, which ends the stuck write too.
func (f *flushConn) Close() error {
	if !f.mu.TryLock() {
		return f.raw.Conn.Close()
	}
	defer f.mu.Unlock()
	return f.Conn.Close()
}

// batchConn is the socket under TLS. Writes while held go to a buffer;
// releasing the hold writes the buffer at once. Writes TLS makes outside a
// hold (the handshake, alerts and key updates from its read side) go out
// after what is buffered, in order.
type batchConn struct {
	net.Conn
	mu      sync.Mutex
	holding bool
	buf     []byte
	failed  error
}

// maxHeld bounds the buffer a connection keeps between writes.
const maxHeld = 1 << 20

func (b *batchConn) hold() {
	b.mu.Lock()
	b.holding = true
	b.mu.Unlock()
}

// release ends the hold and writes what it held.
func (b *batchConn) release() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.holding = false
	return b.flushLocked()
}

func (b *batchConn) flushLocked() error {
	if b.failed != nil {
		return b.failed
	}
	if len(b.buf) == 0 {
		return nil
	}
	_, err := b.Conn.Write(b.buf)
	if cap(b.buf) > maxHeld {
		b.buf = nil
	} else {
		b.buf = b.buf[:0]
	}
	if err != nil {
		b.failed = err
	}
	return err
}

func (b *batchConn) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.failed != nil {
		return 0, b.failed
	}
	if b.holding {
		b.buf = append(b.buf, p...)
		return len(p), nil
	}
	if err := b.flushLocked(); err != nil {
		return 0, err
	}
	return b.Conn.Write(p)
}
