package shard

import (
	"math/rand/v2"
	"testing"
)

// TestSpaceSavingFindsHeavyHitters feeds a Zipf stream through a small
// sketch and checks the space-saving guarantees: every key with more than
// N/k occurrences is kept, and each kept count over-estimates the true count
// by at most its recorded error.
func TestSpaceSavingFindsHeavyHitters(t *testing.T) {
	const capacity, n = 64, 200_000
	rng := rand.New(rand.NewPCG(1, 2))
	z := rand.NewZipf(rng, 1.2, 1, 1<<20)
	truth := map[uint64]uint64{}
	s := newSpaceSaving(capacity)
	for range n {
		k := z.Uint64()
		truth[k]++
		s.add(k, 1)
	}
	got := s.take()
	if len(got) != capacity {
		t.Fatalf("kept %d keys, want %d", len(got), capacity)
	}
	kept := map[uint64]ssEntry{}
	var sum uint64
	for i, e := range got {
		kept[e.key] = e
		sum += e.count
		if i > 0 && got[i-1].count < e.count {
			t.Fatalf("take is not sorted by count at %d", i)
		}
		if tc := truth[e.key]; e.count < tc || e.count-e.err > tc {
			t.Errorf("key %d: count %d (err %d), true %d", e.key, e.count, e.err, tc)
		}
	}
	if sum != n {
		t.Errorf("counts sum to %d, want the stream length %d", sum, n)
	}
	for k, c := range truth {
		if c > n/capacity {
			if _, ok := kept[k]; !ok {
				t.Errorf("key %d occurs %d times (> N/k = %d) but was evicted", k, c, n/capacity)
			}
		}
	}
	if len(s.take()) != 0 {
		t.Error("take did not start a new window")
	}
	// The sketch works again after a window: weights add.
	s.add(7, 5)
	s.add(7, 2)
	if e := s.take(); len(e) != 1 || e[0].count != 7 {
		t.Errorf("second window %v", e)
	}
}

func BenchmarkSpaceSavingAdd(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	z := rand.NewZipf(rng, 1.1, 1, 1<<20)
	keys := make([]uint64, 4096)
	for i := range keys {
		keys[i] = z.Uint64()
	}
	s := newSpaceSaving(hotSketchSize)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		s.add(keys[i%len(keys)], 1)
	}
}
