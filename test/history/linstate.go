package history

import (
	"fmt"
	"hash/maphash"
	"slices"
	"strings"
)

// linState is the per-key model state.
//
// An unknown push could be encoded as an operation that never returns, but
// then every interleaving of every subset of the unknown pushes is a
// distinct porcupine state (its bitset of linearized operations differs even
// when the sums agree), which is exponential in the number of unknown pushes
// per key. Instead an unknown push is an instantaneous registration at its
// call that adds its gradient to a pending multiset, and a pull applies
// whichever pending gradients it needs to explain what it observed. This is
// equivalent: an unknown push's effect can only be seen by pulls after the
// point it takes effect, applying it lazily at the first such pull changes
// nothing observable, and its registration can always be placed at its call
// (before any op called later, after any op returned earlier). Unknown
// pushes of equal gradients become interchangeable, which is what keeps the
// search small.
//
// Configurations only diverge at a pull, which pins the sum, so every
// configuration shares one sum and the state is that sum plus the set of
// possible pending multisets.
type linState struct {
	sum int64 // sum of applied gradients
	// pending holds the possible multisets of registered but not applied
	// gradients, each sorted ascending, the set sorted and deduplicated so
	// equal states compare equal. Never empty; shared, never mutated.
	pending [][]int64
}

var hashSeed = maphash.MakeSeed()

func (s linState) register(g int64) linState {
	out := make([][]int64, len(s.pending))
	for i, m := range s.pending {
		n := make([]int64, 0, len(m)+1)
		j, _ := slices.BinarySearch(m, g)
		n = append(append(append(n, m[:j]...), g), m[j:]...)
		out[i] = n
	}
	return linState{sum: s.sum, pending: canonical(out)}
}

// observe reports whether some configuration can reach sum want by applying
// pending gradients, and the state after doing so.
func (s linState) observe(want int64) (bool, interface{}) {
	need := want - s.sum
	switch {
	case need < 0:
		return false, s
	case need == 0:
		// Gradients are positive, so only the empty subset fits; the common
		// case costs nothing.
		return true, s
	}
	var out [][]int64
	for _, m := range s.pending {
		out = appendRemainders(out, m, need)
	}
	if len(out) == 0 {
		return false, s
	}
	return true, linState{sum: want, pending: canonical(out)}
}

// appendRemainders appends m minus each sub-multiset of m summing to need.
func appendRemainders(out [][]int64, m []int64, need int64) [][]int64 {
	var rec func(i int, need int64, rest []int64)
	// rec decides, for each run of equal values starting at i, how many to
	// take; rest accumulates what is left.
	rec = func(i int, need int64, rest []int64) {
		if need == 0 {
			out = append(out, append(slices.Clone(rest), m[i:]...))
			return
		}
		if i == len(m) || m[i] > need {
			return
		}
		j := i
		for j < len(m) && m[j] == m[i] {
			j++
		}
		for take := 0; take <= j-i && int64(take)*m[i] <= need; take++ {
			rec(j, need-int64(take)*m[i], append(rest, m[i:j-take]...))
		}
	}
	rec(0, need, nil)
	return out
}

func canonical(sets [][]int64) [][]int64 {
	slices.SortFunc(sets, slices.Compare)
	return slices.CompactFunc(sets, slices.Equal)
}

func (s linState) equal(o linState) bool {
	return s.sum == o.sum && slices.EqualFunc(s.pending, o.pending, slices.Equal)
}

func (s linState) hash() uint64 {
	var h maphash.Hash
	h.SetSeed(hashSeed)
	maphash.WriteComparable(&h, s.sum)
	for _, m := range s.pending {
		maphash.WriteComparable(&h, len(m))
		for _, g := range m {
			maphash.WriteComparable(&h, g)
		}
	}
	return h.Sum64()
}

func (s linState) String() string {
	str := fmt.Sprintf("applied %d (row %d)", s.sum, -s.sum)
	if len(s.pending) == 1 && len(s.pending[0]) == 0 {
		return str
	}
	const maxShown = 4
	var alts []string
	for _, m := range s.pending[:min(len(s.pending), maxShown)] {
		alts = append(alts, fmt.Sprint(m))
	}
	if len(s.pending) > maxShown {
		alts = append(alts, fmt.Sprintf("... %d more", len(s.pending)-maxShown))
	}
	return str + ", unknown pushes pending: " + strings.Join(alts, " or ")
}
