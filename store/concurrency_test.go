package store

import (
	"bytes"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
)

// TestConcurrentLookupsApplySnapshots runs Applies, Lookups and snapshots at
// once. Every Apply adds exactly 1 to every column of every key (SGD, lr 1,
// gradient -1) and, every few batches, creates new keys, so:
//   - a Lookup must see all keys it asks for at the same count (it observes
//     Applies whole), and counts never go down between a reader's Lookups;
//   - a snapshot taken at any moment loads to rows that all hold one count.
func TestConcurrentLookupsApplySnapshots(t *testing.T) {
	const dim, keys, applies = 8, 3000, 300
	tab := mustTable(t, TableConfig{Name: "c", Dim: dim, Optimizer: Optimizer{Kind: SGD, LR: 1}})
	base := make([]uint64, keys)
	grads := make([]float32, keys*dim)
	for i := range base {
		base[i] = uint64(i) * 0x9e3779b97f4a7c15
	}
	for i := range grads {
		grads[i] = -1
	}
	mustApply(t, tab, base, grads)

	var done atomic.Bool
	var wg sync.WaitGroup
	errs := make(chan string, 16)
	fail := func(msg string) {
		select {
		case errs <- msg:
		default:
		}
	}
	for r := range 3 {
		wg.Go(func() {
			out := make([]float32, keys*dim)
			last := float32(0)
			for !done.Load() {
				if err := tab.Lookup(base, out); err != nil {
					fail(err.Error())
					return
				}
				first := out[0]
				for i, v := range out {
					if v != first {
						fail(fmt.Sprintf("reader %d: torn lookup: %v at %d beside %v", r, v, i, first))
						return
					}
				}
				if first < last {
					fail("counts went backwards")
					return
				}
				last = first
			}
		})
	}
	wg.Go(func() {
		for !done.Load() {
			s := tab.Snapshot()
			var buf bytes.Buffer
			_, err := s.WriteTo(&buf)
			s.Release()
			if err != nil {
				fail(err.Error())
				return
			}
			loaded, err := Load(&buf)
			if err != nil {
				fail(err.Error())
				return
			}
			out := make([]float32, keys*dim)
			if err := loaded.Lookup(base, out); err != nil {
				fail(err.Error())
				return
			}
			for _, v := range out {
				if v != out[0] {
					fail("snapshot is not of one point in time")
					return
				}
			}
		}
	})
	for a := range applies {
		k := base
		g := grads
		if a%10 == 0 { // a new key each tenth batch, so snapshots race with growth too
			k = append(append([]uint64(nil), base...), uint64(1<<40+a))
			g = append(append([]float32(nil), grads...), make([]float32, dim)...)
		}
		mustApply(t, tab, k, g)
	}
	done.Store(true)
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	out := make([]float32, dim)
	if err := tab.Lookup(base[:1], out); err != nil || out[0] != applies+1 {
		t.Fatalf("final count %v (%v), want %d", out[0], err, applies+1)
	}
}
