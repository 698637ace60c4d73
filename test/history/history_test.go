package history

import (
	"math"

	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// Helpers build ops by hand so each test states its timeline explicitly.

func push(client int, call, ret int64, out Outcome, kv ...int64) Op {
	op := Op{Client: client, Kind: Push, Call: call, Return: ret, Outcome: out}
	for i := 0; i < len(kv); i += 2 {
		op.Keys = append(op.Keys, uint64(kv[i]))
		op.Grads = append(op.Grads, kv[i+1])
	}
	return op
}

func pull(client int, call, ret int64, kv ...int64) Op {
	op := Op{Client: client, Kind: Pull, Call: call, Return: ret, Outcome: OK}
	for i := 0; i < len(kv); i += 2 {
		op.Keys = append(op.Keys, uint64(kv[i]))
		op.Values = append(op.Values, kv[i+1])
	}
	return op
}

func checkLin(t *testing.T, ops []Op, html string) LinResult {
	t.Helper()
	res, err := CheckLinearizable(ops, 10*time.Second, html)
	if err != nil {
		t.Fatalf("CheckLinearizable: %v", err)
	}
	if res.TimedOut {
		t.Fatalf("CheckLinearizable timed out: %v", res)
	}
	return res
}

func TestLinearizableSequential(t *testing.T) {
	ops := []Op{
		pull(0, 0, 1, 1, 0, 2, 0),
		push(0, 2, 3, OK, 1, 2, 2, 1),
		pull(0, 4, 5, 1, -2, 2, -1),
		push(0, 6, 7, OK, 1, 3),
		pull(0, 8, 9, 1, -5, 2, -1),
	}
	res := checkLin(t, ops, "")
	if !res.OK || res.Keys != 2 || res.Ops != 9 {
		t.Fatalf("got %+v, want OK over 2 keys and 9 ops", res)
	}
}

func TestLinearizableConcurrent(t *testing.T) {
	// Two pushes overlap; the pulls see them applied in the opposite order
	// of their calls, which is legal because they overlap.
	ops := []Op{
		push(0, 0, 10, OK, 1, 1),
		push(1, 1, 11, OK, 1, 2),
		pull(2, 2, 3, 1, -2),
		pull(3, 4, 12, 1, -3),
		pull(2, 13, 14, 1, -3),
	}
	if res := checkLin(t, ops, ""); !res.OK {
		t.Fatalf("got %v, want linearizable", res)
	}
}

func TestLinearizableStaleReadFailsAndWritesHTML(t *testing.T) {
	html := filepath.Join(t.TempDir(), "lin.html")
	ops := []Op{
		push(0, 0, 1, OK, 7, 1, 8, 1),
		pull(1, 2, 3, 7, -1, 8, -1),
		push(0, 4, 5, OK, 7, 2),
		pull(1, 6, 7, 7, -1, 8, -1), // key 7 stale: misses the acked +2
	}
	res := checkLin(t, ops, html)
	if res.OK || res.BadKey != 7 || !reflect.DeepEqual(res.BadKeys, []uint64{7}) {
		t.Fatalf("got %+v, want failure on key 7 only", res)
	}
	b, err := os.ReadFile(html)
	if err != nil {
		t.Fatalf("visualisation not written: %v", err)
	}
	if !strings.Contains(string(b), "pull(7) -\\u003e -1") && !strings.Contains(string(b), "pull(7) -> -1") {
		t.Errorf("visualisation does not describe the stale pull")
	}
}

func TestLinearizablePassWritesNoHTML(t *testing.T) {
	html := filepath.Join(t.TempDir(), "lin.html")
	checkLin(t, []Op{push(0, 0, 1, OK, 1, 1), pull(0, 2, 3, 1, -1)}, html)
	if _, err := os.Stat(html); !os.IsNotExist(err) {
		t.Fatalf("visualisation written for a passing history (stat err %v)", err)
	}
}

func TestLinearizableUnknownPushObservedLater(t *testing.T) {
	// The client gave up at 5, yet the push lands after another op.
	ops := []Op{
		push(0, 0, 5, Unknown, 1, 4),
		pull(1, 6, 7, 1, 0),
		push(1, 8, 9, OK, 1, 1),
		pull(1, 10, 11, 1, -5),
		pull(1, 12, 13, 1, -5),
	}
	if res := checkLin(t, ops, ""); !res.OK {
		t.Fatalf("got %v, want linearizable", res)
	}
}

func TestLinearizableUnknownPushNeverObserved(t *testing.T) {
	ops := []Op{
		push(0, 0, -1, Unknown, 1, 4),
		push(1, 1, 2, OK, 1, 1),
		pull(1, 3, 4, 1, -1),
		pull(1, 100, 101, 1, -1),
	}
	if res := checkLin(t, ops, ""); !res.OK {
		t.Fatalf("got %v, want linearizable", res)
	}
}

func TestLinearizableUnknownPushCannotUndo(t *testing.T) {
	// Once observed, an unknown push cannot vanish again.
	ops := []Op{
		push(0, 0, -1, Unknown, 1, 4),
		pull(1, 1, 2, 1, -4),
		pull(1, 3, 4, 1, 0),
	}
	if res := checkLin(t, ops, ""); res.OK {
		t.Fatalf("got %v, want a violation", res)
	}
}

func TestLinearizableFailedPushDropped(t *testing.T) {
	ops := []Op{
		push(0, 0, 1, Failed, 1, 4),
		pull(1, 0, 2, 1, -4), // sees a push that certainly did not happen
	}
	if res := checkLin(t, ops, ""); res.OK {
		t.Fatalf("got %v, want a violation", res)
	}
	ops[1].Values[0] = 0
	if res := checkLin(t, ops, ""); !res.OK {
		t.Fatalf("got %v, want linearizable", res)
	}
}

func TestLinearizableImpossibleValue(t *testing.T) {
	// No subset of {1, 2} sums to 4 (and a positive row can never appear).
	for _, v := range []int64{-4, 3} {
		ops := []Op{
			push(0, 0, 10, OK, 1, 1),
			push(1, 0, 10, Unknown, 1, 2),
			pull(2, 0, 10, 1, v),
		}
		if res := checkLin(t, ops, ""); res.OK || res.BadKey != 1 {
			t.Fatalf("value %d: got %+v, want failure on key 1", v, res)
		}
	}
}

func TestLinearizableRejectsInvalid(t *testing.T) {
	for name, op := range map[string]Op{
		"zero grad":      push(0, 0, 1, OK, 1, 0),
		"negative grad":  push(0, 0, 1, OK, 1, -3),
		"missing values": {Kind: Pull, Keys: []uint64{1}, Call: 0, Return: 1, Outcome: OK},
		"return<call":    push(0, 5, 1, OK, 1, 1),
		"zero kind":      {Keys: []uint64{1}, Return: 1, Outcome: OK},
		"ok no return":   push(0, 0, -1, OK, 1, 1),
	} {
		if _, err := CheckLinearizable([]Op{op}, time.Second, ""); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func TestBounded(t *testing.T) {
	ms := int64(time.Millisecond)
	bound, allowance := 100*time.Millisecond, 10*time.Millisecond
	cases := []struct {
		name  string
		ops   []Op
		wantV []Violation // Message ignored
	}{{
		name: "missing a push acked long before",
		ops: []Op{
			push(0, 0, 1*ms, OK, 1, 2),
			pull(1, 200*ms, 201*ms, 1, 0),
		},
		wantV: []Violation{{Op: 1, Key: 1, Observed: 0, MinExpected: 2, MaxExpected: 2}},
	}, {
		name: "missing a push acked within the bound",
		ops: []Op{
			push(0, 0, 1*ms, OK, 1, 2),
			push(0, 2*ms, 150*ms, OK, 1, 3),
			pull(1, 200*ms, 201*ms, 1, -2),
		},
	}, {
		name: "allowance extends the bound",
		ops: []Op{
			push(0, 0, 95*ms, OK, 1, 3),
			pull(1, 200*ms, 201*ms, 1, 0),
		},
	}, {
		name: "observing more than every invoked push",
		ops: []Op{
			push(0, 0, 1*ms, OK, 1, 2),
			push(0, 2*ms, -1, Unknown, 1, 1),
			pull(1, 3*ms, 4*ms, 1, -4),
			push(0, 5*ms, 6*ms, OK, 1, 1), // invoked after the pull returned
		},
		wantV: []Violation{{Op: 2, Key: 1, Observed: -4, MinExpected: 0, MaxExpected: 3}},
	}, {
		name: "unknown and in-flight pushes may be seen, failed may not",
		ops: []Op{
			push(0, 0, 1*ms, Unknown, 1, 2),
			push(0, 0, -1, Unknown, 1, 1),
			push(0, 0, 1*ms, Failed, 2, 5),
			pull(1, 3*ms, 4*ms, 1, -3, 2, -5),
		},
		wantV: []Violation{{Op: 3, Key: 2, Observed: -5, MinExpected: 0, MaxExpected: 0}},
	}, {
		name: "per key in a multi-key pull",
		ops: []Op{
			push(0, 0, 1*ms, OK, 1, 1, 2, 1),
			pull(1, 500*ms, 501*ms, 1, -1, 2, 0),
		},
		wantV: []Violation{{Op: 1, Key: 2, Observed: 0, MinExpected: 1, MaxExpected: 1}},
	}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := CheckBounded(c.ops, bound, allowance)
			if err != nil {
				t.Fatal(err)
			}
			for i := range got {
				if got[i].Message == "" {
					t.Errorf("violation %d has no message", i)
				}
				got[i].Message = ""
			}
			if !reflect.DeepEqual(got, c.wantV) {
				t.Fatalf("got %+v, want %+v", got, c.wantV)
			}
		})
	}
}

func TestBoundedRejectsNonPositiveGrad(t *testing.T) {
	ops := []Op{push(0, 0, 1, OK, 1, 0), pull(1, 2, 3, 1, 0)}
	if v, err := CheckBounded(ops, time.Second, 0); err == nil || v != nil {
		t.Fatalf("got (%v, %v), want an error and no violations", v, err)
	}
}

func TestFinal(t *testing.T) {
	ops := []Op{
		push(0, 0, 1, OK, 1, 1, 2, 1, 3, 1, 4, 1, 5, 1),
		push(0, 2, 3, OK, 1, 2, 2, 2, 3, 2, 4, 2, 5, 2),
		push(1, 0, 9, Unknown, 3, 4, 4, 4, 5, 4),
		push(1, 10, 11, Unknown, 4, 8),
		push(1, 12, 13, Failed, 1, 100),
	}
	cases := []struct {
		name                  string
		final                 map[uint64]int64
		lost, doubled         int
		resolved, app, notApp int
	}{
		// key 3: unknown {4}; key 4: unknown {4, 8}; key 5: unknown {4}.
		{"exact", map[uint64]int64{1: -3, 2: -3, 3: -3, 4: -3, 5: -3}, 0, 0, 4, 0, 4},
		{"unknown applied", map[uint64]int64{1: -3, 2: -3, 3: -7, 4: -11, 5: -3}, 0, 0, 4, 2, 2},
		{"lost", map[uint64]int64{1: -2, 2: -3, 3: -3, 4: -3, 5: -3}, 1, 0, 4, 0, 4},
		{"doubled past all unknown", map[uint64]int64{1: -4, 2: -3, 3: -3, 4: -3, 5: -3}, 0, 1, 4, 0, 4},
		{"no subset sums", map[uint64]int64{1: -3, 2: -3, 3: -3, 4: -9, 5: -3}, 0, 1, 2, 0, 2},
		{"failed push applied", map[uint64]int64{1: -103, 2: -3, 3: -3, 4: -3, 5: -3}, 0, 1, 4, 0, 4},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := CheckFinal(ops, c.final)
			if r.AckedPushes != 2 || r.UnknownPushes != 2 {
				t.Errorf("counted %d acked, %d unknown push ops; want 2, 2", r.AckedPushes, r.UnknownPushes)
			}
			if r.Lost != c.lost || r.Doubled != c.doubled {
				t.Errorf("lost %d doubled %d, want %d %d\n%v", r.Lost, r.Doubled, c.lost, c.doubled, r)
			}
			if r.Resolved != c.resolved || r.Applied != c.app || r.NotApplied != c.notApp {
				t.Errorf("resolved %d (%d applied, %d not), want %d (%d, %d)",
					r.Resolved, r.Applied, r.NotApplied, c.resolved, c.app, c.notApp)
			}
			if r.OK() != (c.lost+c.doubled == 0) || len(r.Violations) != c.lost+c.doubled {
				t.Errorf("violations %q do not match the counts", r.Violations)
			}
		})
	}
}

func TestFinalAmbiguousUnknown(t *testing.T) {
	// Two unknown pushes of 1 and a final needing exactly one of them: both
	// are consistent, so neither is resolved.
	ops := []Op{push(0, 0, -1, Unknown, 1, 1), push(1, 0, -1, Unknown, 1, 1), push(2, 0, -1, Unknown, 1, 5)}
	r := CheckFinal(ops, map[uint64]int64{1: -1})
	if !r.OK() || r.Resolved != 1 || r.NotApplied != 1 {
		t.Fatalf("got %v, want OK with only the +5 resolved (not applied)", r)
	}
}

func TestFinalMissingAndPhantomKeys(t *testing.T) {
	ops := []Op{push(0, 0, 1, OK, 1, 1)}
	if r := CheckFinal(ops, map[uint64]int64{2: 0}); r.OK() {
		t.Errorf("missing final value for a pushed key passed: %v", r)
	}
	if r := CheckFinal(ops, map[uint64]int64{1: -1, 2: -1}); r.Doubled != 1 {
		t.Errorf("value on a never-pushed key not reported: %v", r)
	}
}

func TestFinalManyUnknown(t *testing.T) {
	var ops []Op
	for i := range 25 {
		ops = append(ops, push(i, 0, -1, Unknown, 1, 1))
	}
	if r := CheckFinal(ops, map[uint64]int64{1: -25}); !r.OK() || r.Applied != 25 {
		t.Errorf("all applied: %v", r)
	}
	if r := CheckFinal(ops, map[uint64]int64{1: -7}); !r.OK() || r.Resolved != 0 {
		t.Errorf("some applied: %v", r)
	}
	if r := CheckFinal(ops, map[uint64]int64{1: -26}); r.Doubled != 1 {
		t.Errorf("too many: %v", r)
	}
}

func TestSubsetSum(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		n := rng.IntN(9)
		grads := make([]int64, n)
		for i := range grads {
			grads[i] = 1 + rng.Int64N(4)
		}
		target := rng.Int64N(12)
		always, sometimes, found := subsetSum(grads, target)
		// Brute force over subsets in binary order.
		wantAlways, wantSometimes, wantFound := ^uint32(0), uint32(0), false
		for m := uint32(0); m < 1<<n; m++ {
			var s int64
			for i := range n {
				if m&(1<<i) != 0 {
					s += grads[i]
				}
			}
			if s == target {
				wantFound = true
				wantAlways &= m
				wantSometimes |= m
			}
		}
		if !wantFound {
			wantAlways = 0
		}
		if always != wantAlways || sometimes != wantSometimes || found != wantFound {
			t.Fatalf("subsetSum(%v, %d) = %b %b %v, want %b %b %v",
				grads, target, always, sometimes, found, wantAlways, wantSometimes, wantFound)
		}
	}
}

func TestFileRoundTrip(t *testing.T) {
	ops := []Op{
		push(0, 0, 10, OK, 1, 1, 2, 2),
		push(1, 1, -1, Unknown, 3, 4),
		pull(2, 2, 3, 1, -1, 2, 0),
		{Client: 3, Kind: Pull, Keys: []uint64{9}, Call: 4, Return: 5, Outcome: Failed, Level: "bounded:100ms"},
	}
	// Keys above 2^53 must survive JSON, which JavaScript-minded encoders lose.
	ops[0].Keys[1], ops[2].Keys[1] = 1<<63+5, 1<<63+5
	path := filepath.Join(t.TempDir(), "h.jsonl")
	if err := WriteFile(path, ops); err != nil {
		t.Fatal(err)
	}
	got, err := ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, ops) {
		t.Fatalf("round trip:\n got %v\nwant %v", got, ops)
	}
	b, _ := os.ReadFile(path)
	if lines := strings.Count(string(b), "\n"); lines != len(ops) || !strings.Contains(string(b), `"kind":"push"`) {
		t.Fatalf("not one readable JSON object per line:\n%s", b)
	}
	if _, err := ReadFile(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Fatal("reading a missing file succeeded")
	}
}

// TestRecorderConcurrent runs a real linearizable store (a mutex-guarded
// map) under many clients, with unknown and in-flight pushes that did or did
// not apply, and requires every checker to accept the recorded history. Run
// it with -race: Ops is called while clients are still recording.
func TestRecorderConcurrent(t *testing.T) {
	r := NewRecorder()
	var mu sync.Mutex
	sums := map[uint64]int64{}
	apply := func(ks []uint64, gs []int64) {
		mu.Lock()
		defer mu.Unlock()
		for j, k := range ks {
			sums[k] += gs[j]
		}
	}
	const clients, perClient, keys = 8, 300, 24
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var snapshots sync.WaitGroup
	snapshots.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
				ops := r.Ops()
				if !sort.SliceIsSorted(ops, func(i, j int) bool { return ops[i].Call < ops[j].Call }) {
					t.Error("Ops not ordered by Call")
					return
				}
			}
		}
	})
	for c := range clients {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(c), 0))
			for i := range perClient {
				ks := []uint64{uint64(rng.IntN(keys)), uint64(rng.IntN(keys))}
				gs := []int64{1 + rng.Int64N(3), 1 + rng.Int64N(3)}
				switch i % 8 {
				case 0, 1, 2:
					p := r.Invoke(c, Push, ks, gs)
					apply(ks, gs)
					gs[0] = 1000 // the recorder must have copied
					p.OK(nil)
				case 3, 4:
					p := r.InvokeLevel(c, Pull, "linearizable", ks, nil)
					mu.Lock()
					vals := []int64{-sums[ks[0]], -sums[ks[1]]}
					mu.Unlock()
					p.OK(vals)
				case 5:
					r.Invoke(c, Push, ks, gs).Fail(true, nil)
				case 6:
					p := r.Invoke(c, Push, ks, gs)
					if rng.IntN(2) == 0 {
						apply(ks, gs)
					}
					p.Fail(false, nil)
				case 7:
					if i+8 >= perClient { // the last op of case 7
						r.Invoke(c, Push, ks, gs) // in flight forever, applied
						apply(ks, gs)
					} else {
						r.Invoke(c, Pull, ks, nil).Fail(false, nil)
					}
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	snapshots.Wait()

	ops := r.Ops()
	if len(ops) != clients*perClient {
		t.Fatalf("recorded %d ops, want %d", len(ops), clients*perClient)
	}
	var inFlight int
	for _, op := range ops {
		if op.Kind == Push && op.Grads[0] == 1000 {
			t.Fatal("recorder kept the caller's grads slice")
		}
		if op.Return == -1 {
			inFlight++
		}
	}
	if inFlight != clients {
		t.Fatalf("%d ops in flight, want %d", inFlight, clients)
	}
	res, err := CheckLinearizable(ops, 30*time.Second, filepath.Join(t.TempDir(), "lin.html"))
	if err != nil || !res.OK {
		t.Fatalf("linearizable store rejected: %v, %v", res, err)
	}
	v, err := CheckBounded(ops, 0, 0)
	if err != nil || len(v) != 0 {
		t.Fatalf("CheckBounded: %v, %v", v, err)
	}
	final := map[uint64]int64{}
	for k, sum := range sums {
		final[k] = -sum
	}
	if f := CheckFinal(ops, final); !f.OK() {
		t.Fatalf("CheckFinal: %v", f)
	}
}

// genHistory simulates clients against a linearizable store: each op takes
// effect at a random instant inside its interval. unknownFrac of pushes end
// Unknown (half of them applied), and a similar share of pulls fail.
func genHistory(seed uint64, clients, nOps, nKeys, maxKeysPerOp int, unknownFrac float64) (ops []Op, final map[uint64]int64) {
	rng := rand.New(rand.NewPCG(seed, 0))
	type timed struct {
		at      int64
		idx     int
		applied bool
	}
	clock := make([]int64, clients)
	var points []timed
	for i := range nOps {
		c := i % clients
		call := clock[c] + rng.Int64N(1000)
		at := call + rng.Int64N(5000)
		ret := at + rng.Int64N(5000)
		n := 1 + rng.IntN(maxKeysPerOp)
		op := Op{Client: c, Call: call, Return: ret, Outcome: OK}
		for range n {
			op.Keys = append(op.Keys, uint64(rng.IntN(nKeys)))
		}
		applied := true
		if rng.IntN(2) == 0 {
			op.Kind = Push
			for range n {
				op.Grads = append(op.Grads, 1+rng.Int64N(3))
			}
			if rng.Float64() < unknownFrac {
				op.Outcome = Unknown
				applied = rng.IntN(2) == 0
				ret = call + 20000 // the client's timeout
			}
		} else {
			op.Kind = Pull
			if rng.Float64() < unknownFrac {
				op.Outcome = Failed
			}
		}
		clock[c] = ret
		ops = append(ops, op)
		points = append(points, timed{at, i, applied})
	}
	sort.Slice(points, func(i, j int) bool { return points[i].at < points[j].at })
	final = map[uint64]int64{}
	for _, p := range points {
		op := &ops[p.idx]
		if op.Kind == Push && p.applied {
			for j, k := range op.Keys {
				final[k] -= op.Grads[j]
			}
		}
		if op.Kind == Pull && op.Outcome == OK {
			for _, k := range op.Keys {
				op.Values = append(op.Values, final[k])
			}
		}
	}
	sort.SliceStable(ops, func(i, j int) bool { return ops[i].Call < ops[j].Call })
	return ops, final
}

// TestLinearizableLarge shows the per-key model keeps porcupine fast on a
// chaos-sized history, and that a single corrupted pull in it is found.
func TestLinearizableLarge(t *testing.T) {
	if testing.Short() {
		t.Skip("large history")
	}
	ops, final := genHistory(1, 8, 20000, 200, 4, 0.2)
	start := time.Now()
	res, err := CheckLinearizable(ops, time.Minute, "")
	elapsed := time.Since(start)
	if err != nil || !res.OK {
		t.Fatalf("got %v, %v; want linearizable", res, err)
	}
	t.Logf("%v in %v", res, elapsed)
	if elapsed > 10*time.Second {
		t.Errorf("checking took %v, want a few seconds", elapsed)
	}
	if f := CheckFinal(ops, final); !f.OK() {
		t.Fatalf("CheckFinal: %v", f)
	}
	if v, err := CheckBounded(ops, 0, 0); err != nil || len(v) != 0 {
		t.Fatalf("CheckBounded: %v %v", v, err)
	}

	// Make the last OK pull observe its key's initial value: stale, given
	// the acknowledged pushes to it earlier in a 20k-op history.
	for i := len(ops) - 1; i >= 0; i-- {
		if ops[i].Kind == Pull && ops[i].Outcome == OK && ops[i].Values[0] != 0 {
			ops[i].Values[0] = 0
			break
		}
	}
	start = time.Now()
	html := filepath.Join(t.TempDir(), "lin.html")
	res, err = CheckLinearizable(ops, time.Minute, html)
	if err != nil || res.OK || len(res.BadKeys) != 1 {
		t.Fatalf("got %+v, %v; want exactly one bad key", res, err)
	}
	if _, err := os.Stat(html); err != nil {
		t.Fatal(err)
	}
	t.Logf("%v in %v", res, time.Since(start))
}

func BenchmarkCheckLinearizable(b *testing.B) {
	ops, _ := genHistory(1, 8, 20000, 200, 4, 0.2)
	for b.Loop() {
		if res, err := CheckLinearizable(ops, time.Minute, ""); err != nil || !res.OK {
			b.Fatalf("%v %v", res, err)
		}
	}
}

// TestModelMatchesInfiniteReturn checks the pending-multiset encoding of
// unknown pushes (linState) against the textbook one, an unknown push that
// never returns, on small random histories where the textbook one is cheap.
func TestModelMatchesInfiniteReturn(t *testing.T) {
	textbook := porcupine.Model{
		Init: func() interface{} { return int64(0) },
		Step: func(state, input, output interface{}) (bool, interface{}) {
			in := input.(linInput)
			if in.Kind == linPull {
				return output.(int64) == -state.(int64), state
			}
			return true, state.(int64) + in.Grad
		},
	}
	rng := rand.New(rand.NewPCG(3, 4))
	var legal, illegal int
	for iter := range 400 {
		ops, _ := genHistory(uint64(iter), 3, 14, 1, 1, 0.4)
		// Perturb a pull now and then so both verdicts occur.
		for i := range ops {
			if ops[i].Kind == Pull && ops[i].Outcome == OK && rng.IntN(6) == 0 {
				ops[i].Values[0] += rng.Int64N(5) - 2
			}
		}
		res, err := CheckLinearizable(ops, 10*time.Second, "")
		if err != nil || res.TimedOut {
			t.Fatalf("%v %v", res, err)
		}
		var hist []porcupine.Operation
		for _, pop := range linOperations(ops)[0] {
			if pop.Input.(linInput).Kind == linUnknown {
				in := pop.Input.(linInput)
				in.Kind = linPush
				pop.Input, pop.Return = in, math.MaxInt64
			}
			hist = append(hist, pop)
		}
		want := porcupine.CheckOperations(textbook, hist)
		if res.OK != want {
			t.Fatalf("history %d: pending model says %v, textbook model %v:\n%v", iter, res.OK, want, ops)
		}
		if want {
			legal++
		} else {
			illegal++
		}
	}
	if legal < 50 || illegal < 50 {
		t.Fatalf("unbalanced sample: %d legal, %d illegal", legal, illegal)
	}
}

// TestReadGap: the longest stretch of a window without a completed pull,
// counting the window's edges; pushes and failed pulls complete nothing.
func TestReadGap(t *testing.T) {
	pull := func(ret int64, o Outcome) Op { return Op{Kind: Pull, Return: ret, Outcome: o} }
	ops := []Op{
		pull(5, OK), pull(12, OK), {Kind: Push, Return: 30, Outcome: OK}, pull(40, Failed), pull(50, OK),
		pull(55, Unknown), pull(-1, Unknown), pull(200, OK),
	}
	for _, tc := range []struct {
		from, to int64
		want     time.Duration
	}{
		{0, 100, 50},  // 50..100 (the pull at 200 is past the window)
		{0, 60, 38},   // 12..50
		{13, 60, 37},  // 13..50
		{60, 100, 40}, // none in the window
		{0, 300, 150}, // 50..200
	} {
		if got := ReadGap(ops, tc.from, tc.to); got != tc.want {
			t.Errorf("ReadGap(%d, %d) = %d, want %d", tc.from, tc.to, got, tc.want)
		}
	}
}
