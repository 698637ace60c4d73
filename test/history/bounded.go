package history

import (
	"fmt"
	"sort"
	"time"
)

// Violation is a pull whose observed value is impossible under the bound.
type Violation struct {
	Op          int    // index into the checked ops
	Key         uint64 // the offending key of that pull
	Observed    int64  // the row value the pull returned
	MinExpected int64  // least sum of applied gradients the bound allows
	MaxExpected int64  // greatest sum of applied gradients any push allows
	Message     string
}

func (v Violation) String() string {
	return fmt.Sprintf("op %d key %d: %s", v.Op, v.Key, v.Message)
}

// CheckBounded checks bounded staleness: a pull may miss pushes that were
// acknowledged recently, but not ones acknowledged more than bound+allowance
// before it was called, and may never see more than has been pushed.
//
// For every OK pull and each of its keys k, with v the observed value:
//
//	A = sum of grads of OK pushes to k with Return < pull.Call - bound - allowance
//	U = sum of grads of OK or Unknown pushes to k with Call <= pull.Return
//	A <= -v <= U must hold.
//
// U includes pushes called at exactly pull.Return because intervals are
// closed: with a coarse clock the two may have overlapped. allowance absorbs
// what the bound does not promise to cover, such as the lag between an ack
// and the replica's clock. Because gradients are positive this is necessary,
// not sufficient: a value within [A, U] that no subset of pushes sums to is
// not caught here (CheckLinearizable and CheckFinal catch that).
//
// The error reports an invalid history (see Validate), e.g. a push with a
// non-positive gradient, for which the bounds above are meaningless; in that
// case no violations are returned.
func CheckBounded(ops []Op, bound, allowance time.Duration) ([]Violation, error) {
	if err := Validate(ops); err != nil {
		return nil, err
	}
	type pushAt struct{ t, grad int64 }
	acked := map[uint64][]pushAt{}   // OK pushes, by Return
	invoked := map[uint64][]pushAt{} // OK and Unknown pushes, by Call
	for i := range ops {
		op := &ops[i]
		if op.Kind != Push || op.Outcome == Failed {
			continue
		}
		for j, k := range op.Keys {
			g := op.Grads[j]
			invoked[k] = append(invoked[k], pushAt{op.Call, g})
			if op.Outcome == OK {
				acked[k] = append(acked[k], pushAt{op.Return, g})
			}
		}
	}
	// Sorting by time and keeping prefix sums makes each lookup a binary
	// search, so a 20k-op history checks in milliseconds.
	prefix := func(m map[uint64][]pushAt) {
		for _, ps := range m {
			sort.Slice(ps, func(i, j int) bool { return ps[i].t < ps[j].t })
			for i := 1; i < len(ps); i++ {
				ps[i].grad += ps[i-1].grad
			}
		}
	}
	prefix(acked)
	prefix(invoked)
	// sumBefore is the total of pushes with time < t (or <= t if inclusive).
	sumBefore := func(ps []pushAt, t int64, inclusive bool) int64 {
		n := sort.Search(len(ps), func(i int) bool {
			if inclusive {
				return ps[i].t > t
			}
			return ps[i].t >= t
		})
		if n == 0 {
			return 0
		}
		return ps[n-1].grad
	}

	var out []Violation
	for i := range ops {
		op := &ops[i]
		if op.Kind != Pull || op.Outcome != OK {
			continue
		}
		cutoff := op.Call - int64(bound) - int64(allowance)
		for j, k := range op.Keys {
			v := op.Values[j]
			a := sumBefore(acked[k], cutoff, false)
			u := sumBefore(invoked[k], op.Return, true)
			var msg string
			switch {
			case -v < a:
				msg = fmt.Sprintf("stale: observed %d, but pushes acknowledged more than %v+%v before the call sum to %d", v, bound, allowance, a)
			case -v > u:
				msg = fmt.Sprintf("observed %d, more than the %d of every push invoked before the return", v, u)
			default:
				continue
			}
			out = append(out, Violation{Op: i, Key: k, Observed: v, MinExpected: a, MaxExpected: u, Message: msg})
		}
	}
	return out, nil
}
