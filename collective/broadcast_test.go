package collective

import (
	"context"
	"fmt"
	"math"
	"sync/atomic"
	"testing"
	"time"
)

func TestBroadcast(t *testing.T) {
	for _, n := range []int{1, 2, 3, 5, 8} {
		// Small chunks so that the chain pipelines several frames.
		gs := makeGroup(t, n, func(c *Config) { c.ChunkBytes = 4 << 10; c.SmallBytes = 1 << 10 })
		for root := range n {
			for _, size := range []int{0, 1, 7, 256, 257, 10007} { // 256: tree; 257: chain
				t.Run(fmt.Sprintf("N=%d/root=%d/%d", n, root, size), func(t *testing.T) {
					bufs := make([][]float32, n)
					for r := range bufs {
						bufs[r] = make([]float32, size)
						for i := range bufs[r] {
							bufs[r][i] = value(r+100*root, i)
						}
					}
					want := append([]float32(nil), bufs[root]...)
					noErrors(t, onAll(gs, func(r int, g *Group) error {
						return g.Broadcast(context.Background(), bufs[r], root)
					}))
					for r := range n {
						for i := range want {
							if math.Float32bits(bufs[r][i]) != math.Float32bits(want[i]) {
								t.Fatalf("rank %d element %d: %g, want %g", r, i, bufs[r][i], want[i])
							}
						}
					}
				})
			}
		}
	}
}

// TestBarrier: ranks arrive at staggered times; none may leave before the
// last has arrived.
func TestBarrier(t *testing.T) {
	for _, n := range []int{1, 2, 3, 5, 8} {
		t.Run(fmt.Sprint("N=", n), func(t *testing.T) {
			gs := makeGroup(t, n, nil)
			for round := range 4 {
				var arrived atomic.Int32
				noErrors(t, onAll(gs, func(r int, g *Group) error {
					// The late rank changes every round.
					time.Sleep(time.Duration((r+round)%n) * 3 * time.Millisecond)
					arrived.Add(1)
					if err := g.Barrier(context.Background()); err != nil {
						return err
					}
					if a := arrived.Load(); int(a) != n {
						return fmt.Errorf("round %d: left the barrier when %d of %d had arrived", round, a, n)
					}
					return nil
				}))
			}
		})
	}
}

// TestMixedOperations runs a sequence of different operations on one group.
func TestMixedOperations(t *testing.T) {
	gs := makeGroup(t, 4, nil)
	for i := range 20 {
		switch i % 3 {
		case 0:
			runAllReduce(t, gs, 1+i*37, Sum)
		case 1:
			noErrors(t, onAll(gs, func(r int, g *Group) error { return g.Barrier(context.Background()) }))
		case 2:
			noErrors(t, onAll(gs, func(r int, g *Group) error {
				return g.Broadcast(context.Background(), make([]float32, i), i%4)
			}))
		}
	}
}
