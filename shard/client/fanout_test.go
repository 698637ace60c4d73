package client

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/raftps/raftps/shard/api"
)

// splitKeysMap is the map-based split splitKeys replaced: the reference it
// must agree with.
func splitKeysMap(keys []uint64, shards uint32) *split {
	sp := &split{keys: make([][]uint64, shards), pos: make([][]int, shards), of: make([]int, len(keys)), sh: make([]uint32, len(keys))}
	seen := make(map[uint64]int, len(keys))
	for i, k := range keys {
		s := api.ShardOf(k, shards)
		sp.sh[i] = s
		if j, ok := seen[k]; ok {
			sp.of[i] = j
			continue
		}
		j := len(sp.keys[s])
		seen[k] = j
		sp.of[i] = j
		sp.keys[s] = append(sp.keys[s], k)
		sp.pos[s] = append(sp.pos[s], i)
	}
	return sp
}

// TestSplitKeys: the split of a batch with repeated keys (Zipf-like, many
// repeats of a few keys), with key 0 and with keys whose hashes share the
// table's slot bits, is the map-based split's, for batches of every size
// the scratch table is reused across (so a table not cleared after a call
// would show as a key found that the batch does not hold).
func TestSplitKeys(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	// Keys whose hashes have the same high bits: the same slot in any
	// table of up to 2^20 slots, so every probe after the first collides.
	var sameSlot []uint64
	for k := uint64(0); len(sameSlot) < 64; k++ {
		if api.Mix64(k)>>44 == api.Mix64(0)>>44 {
			sameSlot = append(sameSlot, k)
		}
	}
	for _, n := range []int{0, 1, 2, 3, 7, 100, 4096, 5000, 17, 1} {
		for _, shards := range []uint32{1, 2, 16, 7} {
			keys := make([]uint64, n)
			for i := range keys {
				switch r.IntN(4) {
				case 0:
					keys[i] = uint64(r.IntN(8)) // repeated, and 0
				case 1:
					keys[i] = sameSlot[r.IntN(len(sameSlot))]
				default:
					keys[i] = r.Uint64()
				}
			}
			got, want := splitKeys(keys, shards), splitKeysMap(keys, shards)
			if !slices.Equal(got.of, want.of) || !slices.Equal(got.sh, want.sh) {
				t.Fatalf("n=%d shards=%d: of/sh differ from the map's split", n, shards)
			}
			for s := range want.keys {
				if !slices.Equal(got.keys[s], want.keys[s]) || !slices.Equal(got.pos[s], want.pos[s]) {
					t.Fatalf("n=%d shards=%d shard %d: keys %v pos %v, want %v %v", n, shards, s, got.keys[s], got.pos[s], want.keys[s], want.pos[s])
				}
			}
			for i, k := range keys {
				if got.keys[got.sh[i]][got.of[i]] != k {
					t.Fatalf("n=%d shards=%d: position %d does not point at its key", n, shards, i)
				}
			}
		}
	}
}

func BenchmarkSplitKeys(b *testing.B) {
	z := rand.NewZipf(rand.New(rand.NewPCG(3, 4)), 1.1, 1, 1<<20)
	keys := make([]uint64, 4096)
	for i := range keys {
		keys[i] = z.Uint64() // Zipf(1.1) over 1M keys, as the bench
	}
	b.ReportAllocs()
	for b.Loop() {
		splitKeys(keys, 16)
	}
}
