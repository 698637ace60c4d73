package grpcopt

import (
	"context"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
)

func TestPoolSizes(t *testing.T) {
	for _, n := range []int{0, 1, 255, 256, 257, 4096, 4097, 1 << 20, 1<<24 - 1, 1 << 24} {
		p := pool.Get(n)
		if len(*p) != n {
			t.Fatalf("Get(%d) has length %d", n, len(*p))
		}
		if c := cap(*p); c < n || c&(c-1) != 0 || c < 256 {
			t.Fatalf("Get(%d) has capacity %d, want a power of two >= max(n, 256)", n, c)
		}
		pool.Put(p)
	}
	// Larger than the largest tier: exact size, and Put drops it.
	p := pool.Get(1<<24 + 1)
	if len(*p) != 1<<24+1 {
		t.Fatalf("large Get has length %d", len(*p))
	}
	pool.Put(p)
	// A buffer that is not a tier's size is not pooled: a later Get of its
	// length must not see a too-small capacity.
	odd := make([]byte, 300)
	pool.Put(&odd)
	if q := pool.Get(300); cap(*q) < 300 {
		t.Fatalf("Get(300) has capacity %d", cap(*q))
	}
}

func TestPoolReuses(t *testing.T) {
	p := pool.Get(1000)
	(*p)[0] = 42
	pool.Put(p)
	// sync.Pool may drop it; when it does not, the buffer comes back with
	// the requested length (not cleared, by design).
	q := pool.Get(600)
	if len(*q) != 600 || cap(*q) != 1024 {
		t.Fatalf("Get(600): len %d cap %d", len(*q), cap(*q))
	}
}

// countingPool counts the buffers taken from the pool it wraps.
type countingPool struct {
	mem.BufferPool
	gets atomic.Int64
}

func (c *countingPool) Get(n int) *[]byte { c.gets.Add(1); return c.BufferPool.Get(n) }

// TestServerReadsIntoThePool: a server given Server's options reads a
// request's frames into this package's pool, not grpc's own (which a
// server otherwise keeps from grpc's initialisation, whatever Install
// sets later). The client here uses grpc's pool, so every Get counted is
// the server's.
func TestServerReadsIntoThePool(t *testing.T) {
	counting := &countingPool{BufferPool: pool}
	saved := pool
	pool = counting
	defer func() { pool = saved }()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(Server()...)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go srv.Serve(lis)
	defer srv.Stop()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// An unknown service: NotFound, after the server read the request.
	_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: strings.Repeat("x", 4096)})
	if status.Code(err) != codes.NotFound {
		t.Fatalf("health check: %v, want NotFound", err)
	}
	if counting.gets.Load() == 0 {
		t.Fatal("the server read the request without taking a buffer from the pool")
	}
}
