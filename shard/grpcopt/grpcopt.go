package grpcopt

import (
	"math/bits"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/mem"
)

const (
	// bufferBytes is each connection's read and write buffer. grpc's 32 KiB
	// default costs a write syscall per two 16 KiB frames; a 1 MiB push or
	// pull answer then takes about 64 of them.
	bufferBytes = 256 << 10
	// windowBytes is a stream's initial flow-control window (the
	// connection's is four times it). A fixed window this size turns off
	// grpc's BDP probing, whose 64 KiB start makes a 1 MiB message wait for
	// window updates on the first calls of every connection.
	windowBytes = 4 << 20
)

// Install makes grpc use a buffer pool that does not clear the buffers it
// hands out. grpc's default pool clears a buffer's whole capacity on every
// Get (a power of two, so up to twice the message), which was 8% of a
// server's CPU under push load; every byte of a buffer grpc gets from a
// pool is written before it is read (a received message's bytes, or the
// marshalled message), so clearing protects nothing here. It also sets the
// pool the proto codec marshals into, which only this global setting
// reaches, so a program calls it once, first thing in main, before any
// connection or server exists.
func Install() { experimental.SetDefaultBufferPool(pool) }

// Server returns the buffer and window settings for a grpc.Server, and
// the pool: a server takes grpc's own pool (which clears every buffer)
// when the grpc package initialises, before Install can run, and reads
// every frame of every request into it unless given this one.
func Server() []grpc.ServerOption {
	return []grpc.ServerOption{
		experimental.BufferPool(pool),
		grpc.WriteBufferSize(bufferBytes), grpc.ReadBufferSize(bufferBytes),
		grpc.InitialWindowSize(windowBytes), grpc.InitialConnWindowSize(4 * windowBytes),
	}
}

// Dial returns the same settings for a grpc.ClientConn.
func Dial() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithWriteBufferSize(bufferBytes), grpc.WithReadBufferSize(bufferBytes),
		grpc.WithInitialWindowSize(windowBytes), grpc.WithInitialConnWindowSize(4 * windowBytes),
	}
}

const (
	minShift = 8  // 256 B, the smallest buffer pooled
	maxShift = 24 // 16 MiB, the largest; larger ones are allocated each time
)

var pool mem.BufferPool = &tiered{}

// tiered keeps one sync.Pool per power of two from 256 B to 16 MiB. A
// buffer is handed out with the length asked for and the capacity of its
// tier; its bytes are whatever the last user left.
type tiered struct {
	pools [maxShift + 1]sync.Pool
}

func shiftFor(n int) int {
	if n <= 1<<minShift {
		return minShift
	}
	return bits.Len(uint(n - 1))
}

func (t *tiered) Get(length int) *[]byte {
	s := shiftFor(length)
	if s > maxShift {
		b := make([]byte, length)
		return &b
	}
	if p, ok := t.pools[s].Get().(*[]byte); ok {
		*p = (*p)[:length]
		return p
	}
	b := make([]byte, length, 1<<s)
	return &b
}

func (t *tiered) Put(p *[]byte) {
	c := cap(*p)
	if c < 1<<minShift || c&(c-1) != 0 {
		return // not one of ours, or not a tier's size: let GC have it
	}
	s := bits.Len(uint(c)) - 1
	if s > maxShift {
		return
	}
	*p = (*p)[:0]
	t.pools[s].Put(p)
}
