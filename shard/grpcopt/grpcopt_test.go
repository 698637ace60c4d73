package grpcopt

import "testing"

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
