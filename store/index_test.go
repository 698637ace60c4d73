package store

import (
	"slices"
	"testing"
)

// unfmix64 inverts fmix64: each xorshift by 33 is its own inverse, and the
// multiplications are undone by the constants' inverses mod 2^64.
func unfmix64(h uint64) uint64 {
	h ^= h >> 33
	h *= inverse64(0xc4ceb9fe1a85ec53)
	h ^= h >> 33
	h *= inverse64(0xff51afd7ed558ccd)
	h ^= h >> 33
	return h
}

// inverse64 is a's inverse mod 2^64 (a odd), by Newton's iteration.
func inverse64(a uint64) uint64 {
	x := a // correct to 3 bits; each step doubles them
	for range 5 {
		x *= 2 - a*x
	}
	return x
}

// TestLookupFingerprintCollisions: keys whose hashes share the index
// segment and the 32-bit fingerprint (so the same probe start) must each
// find their own row, and a missing key sharing them must find none, in
// whatever order the batch names them. The index trusts a fingerprint
// match only after comparing the row's key.
func TestLookupFingerprintCollisions(t *testing.T) {
	base := hashKey(12345)
	var keys []uint64
	for i := range uint64(4) {
		h := base&^(0xff<<32) | (base>>32+i)&0xff<<32 // top byte and low 32 bits kept
		k := unfmix64(h)
		if hashKey(k) != h {
			t.Fatalf("unfmix64 is not fmix64's inverse at %#x", h)
		}
		keys = append(keys, k)
	}
	for i := 1; i < len(keys); i++ {
		a, b := hashKey(keys[0]), hashKey(keys[i])
		if a>>56 != b>>56 || uint32(a) != uint32(b) {
			t.Fatalf("keys %#x and %#x do not collide: hashes %#x %#x", keys[0], keys[i], a, b)
		}
	}
	cfg := TableConfig{Name: "fp", Dim: 2, Init: Initializer{Kind: InitZeros}, Optimizer: Optimizer{Kind: SGD, LR: 1}}
	tab := mustTable(t, cfg)
	// keys[0..2] get rows with distinct values; keys[3] is never written.
	present := keys[:3]
	for i, k := range present {
		if err := tab.Apply([]uint64{k}, []float32{-float32(i + 1), -float32(10 * (i + 1))}); err != nil {
			t.Fatal(err)
		}
	}
	want := map[uint64][2]float32{keys[0]: {1, 10}, keys[1]: {2, 20}, keys[2]: {3, 30}, keys[3]: {0, 0}}
	for _, order := range [][]int{{0, 1, 2, 3}, {3, 2, 1, 0}, {2, 3, 0, 1}, {1, 1, 3, 2}} {
		var batch []uint64
		for _, i := range order {
			batch = append(batch, keys[i])
		}
		out := make([]float32, 2*len(batch))
		if err := tab.Lookup(batch, out); err != nil {
			t.Fatal(err)
		}
		for j, k := range batch {
			if w := want[k]; !slices.Equal(out[2*j:2*j+2], w[:]) {
				t.Fatalf("order %v: key %#x got %v, want %v", order, k, out[2*j:2*j+2], w)
			}
		}
	}
	if n := tab.Len(); n != 3 {
		t.Fatalf("%d rows, want 3 (a lookup creates none)", n)
	}
	// An apply to the colliding keys changes each one's row only.
	if err := tab.Apply([]uint64{keys[2], keys[0]}, []float32{1, 1, -1, -1}); err != nil {
		t.Fatal(err)
	}
	out := make([]float32, 6)
	if err := tab.Lookup(present, out); err != nil {
		t.Fatal(err)
	}
	if w := []float32{2, 11, 2, 20, 2, 29}; !slices.Equal(out, w) {
		t.Fatalf("after the apply: %v, want %v", out, w)
	}
}
