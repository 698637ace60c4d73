package history

import (
	"fmt"
	"math/bits"
	"sort"
	"strings"
)

// maxExactUnknown is how many unknown pushes to one key CheckFinal resolves
// exactly, by enumerating their subsets; beyond it only the range is checked.
const maxExactUnknown = 20

// FinalResult is the verdict of CheckFinal. Counts of unknown pushes are per
// (op, key) pair except UnknownPushes, because a push to several keys may
// land on some and not others.
type FinalResult struct {
	AckedPushes   int // OK push ops
	UnknownPushes int // Unknown push ops
	Lost          int // keys whose final value misses an acknowledged push
	Doubled       int // keys whose final value no set of pushes explains (applied twice, or phantom)
	// Resolved is how many (unknown push, key) pairs are provably applied
	// or provably not; Applied and NotApplied split it. Approximate for a
	// key with more than 20 unknown pushes, where only the all-or-nothing
	// cases are resolved.
	Resolved, Applied, NotApplied int
	Violations                    []string
}

// OK reports whether no violation was found.
func (r FinalResult) OK() bool { return len(r.Violations) == 0 }

func (r FinalResult) String() string {
	s := fmt.Sprintf("final: %d acked pushes, %d unknown (%d key-pushes resolved: %d applied, %d not), %d keys lost, %d doubled",
		r.AckedPushes, r.UnknownPushes, r.Resolved, r.Applied, r.NotApplied, r.Lost, r.Doubled)
	if len(r.Violations) > 0 {
		s += "\n  " + strings.Join(r.Violations, "\n  ")
	}
	return s
}

// CheckFinal checks the table after the cluster has healed and every
// operation has settled. final maps each key to element 0 of its row, read
// linearizably; keys pushed to but missing from final are violations.
//
// For each key, with Acked the sum of gradients of its OK pushes and d =
// -final - Acked the amount contributed by Unknown pushes:
//   - d < 0 means an acknowledged push was lost;
//   - d > sum of the key's unknown gradients means some push was applied
//     twice (or a value appeared from nowhere);
//   - with at most 20 unknown pushes to the key, d must also be the sum of
//     some subset of them, else the value is inconsistent (counted as
//     doubled: no at-most-once application explains it).
//
// An invalid history (see Validate) is reported as a single violation.
func CheckFinal(ops []Op, final map[uint64]int64) FinalResult {
	var res FinalResult
	if err := Validate(ops); err != nil {
		res.Violations = append(res.Violations, "invalid history: "+err.Error())
		return res
	}
	acked := map[uint64]int64{}
	unknown := map[uint64][]int64{}
	for i := range ops {
		op := &ops[i]
		if op.Kind != Push || op.Outcome == Failed {
			continue
		}
		if op.Outcome == OK {
			res.AckedPushes++
		} else {
			res.UnknownPushes++
		}
		for j, k := range op.Keys {
			if op.Outcome == OK {
				acked[k] += op.Grads[j]
			} else {
				unknown[k] = append(unknown[k], op.Grads[j])
			}
		}
	}

	keySet := map[uint64]struct{}{}
	for k := range acked {
		keySet[k] = struct{}{}
	}
	for k := range unknown {
		keySet[k] = struct{}{}
	}
	for k := range final {
		keySet[k] = struct{}{}
	}
	keys := make([]uint64, 0, len(keySet))
	for k := range keySet {
		keys = append(keys, k)
	}
	// Sorted so that the violations read the same on every run.
	sort.Slice(keys, func(i, j int) bool { return keys[i] < keys[j] })

	for _, k := range keys {
		v, ok := final[k]
		if !ok {
			res.Violations = append(res.Violations, fmt.Sprintf("key %d: no final value", k))
			continue
		}
		unk := unknown[k]
		var unkSum int64
		for _, g := range unk {
			unkSum += g
		}
		d := -v - acked[k]
		switch {
		case d < 0:
			res.Lost++
			res.Violations = append(res.Violations, fmt.Sprintf(
				"key %d: lost: final %d, but acknowledged pushes sum to %d (missing %d)", k, v, acked[k], -d))
			continue
		case d > unkSum:
			res.Doubled++
			res.Violations = append(res.Violations, fmt.Sprintf(
				"key %d: doubled: final %d exceeds acknowledged %d plus all %d unknown pushes (%d) by %d",
				k, v, acked[k], len(unk), unkSum, d-unkSum))
			continue
		}
		if len(unk) > maxExactUnknown {
			// Only the extremes are decidable without enumeration: since
			// gradients are positive, 0 means none applied and the full sum
			// means all applied.
			if d == 0 || d == unkSum {
				res.Resolved += len(unk)
				if d == 0 {
					res.NotApplied += len(unk)
				} else {
					res.Applied += len(unk)
				}
			}
			continue
		}
		always, sometimes, found := subsetSum(unk, d)
		if !found {
			res.Doubled++
			res.Violations = append(res.Violations, fmt.Sprintf(
				"key %d: inconsistent: final %d needs %d from unknown pushes %v, which no subset sums to",
				k, v, d, unk))
			continue
		}
		applied := bits.OnesCount32(always)
		notApplied := len(unk) - bits.OnesCount32(sometimes)
		res.Applied += applied
		res.NotApplied += notApplied
		res.Resolved += applied + notApplied
	}
	return res
}

// subsetSum enumerates the subsets of grads (at most 32, in practice at most
// maxExactUnknown) summing to target and returns the bitmask of items in all
// of them and of items in any of them. Enumerating in Gray-code order changes
// one item per step, so 2^20 subsets take milliseconds and need no table
// sized by the (unbounded) sum.
func subsetSum(grads []int64, target int64) (always, sometimes uint32, found bool) {
	n := len(grads)
	always = ^uint32(0)
	var sum int64
	var mask uint32
	for i := uint64(0); ; i++ {
		if sum == target {
			found = true
			always &= mask
			sometimes |= mask
		}
		if i+1 == 1<<n {
			break
		}
		// Gray code i -> i+1 flips the bit at the lowest set bit of i+1.
		b := bits.TrailingZeros64(i + 1)
		mask ^= 1 << b
		if mask&(1<<b) != 0 {
			sum += grads[b]
		} else {
			sum -= grads[b]
		}
	}
	if !found {
		always = 0
	}
	return always, sometimes, found
}
