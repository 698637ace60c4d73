package collective

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

const qLen = 1000 // state length in these tests

// qInitial is the initial state of the quorum tests.
func qInitial() []float32 {
	s := make([]float32, qLen)
	for i := range s {
		s[i] = value(99, i)
	}
	return s
}

// qContrib is rank r's contribution for step, computed from the state it
// fetched: deterministic, so a test can recompute every step.
func qContrib(r int, step uint64, state, dst []float32) {
	for i := range dst {
		dst[i] = value(r, i+int(step)) + 0.5*state[i]
	}
}

// sgd is the Update of the tests.
func sgd(_ uint64, sum []float32, n int, state []float32) {
	for i := range state {
		state[i] -= 0.1 * sum[i] / float32(n)
	}
}

// qRecord collects every rank's Submit results.
type qRecord struct {
	mu  sync.Mutex
	acc map[uint64][]int // step -> ranks accepted
}

func (rec *qRecord) accepted(step uint64, r int) {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if rec.acc == nil {
		rec.acc = make(map[uint64][]int)
	}
	rec.acc[step] = append(rec.acc[step], r)
}

// replay recomputes the run from the recorded accepted sets, adding each
// step's contributions in rank order as the coordinator does, and returns
// the final state.
func (rec *qRecord) replay(t *testing.T, steps uint64, need int) []float32 {
	t.Helper()
	state := qInitial()
	sum := make([]float32, qLen)
	c := make([]float32, qLen)
	for s := uint64(1); s <= steps; s++ {
		ranks := slices.Sorted(slices.Values(rec.acc[s]))
		if len(ranks) != need {
			t.Fatalf("step %d: accepted ranks %v, want %d of them", s, ranks, need)
		}
		qContrib(ranks[0], s, state, sum)
		for _, r := range ranks[1:] {
			qContrib(r, s, state, c)
			for i := range sum {
				sum[i] = sum[i] + c[i]
			}
		}
		sgd(s, sum, need, state)
	}
	return state
}

// qHooks changes one rank's behaviour in train.
type qHooks struct {
	beforeSubmit func(step uint64)
	beforeDone   func(step uint64)
	// leave, if it returns true after Submit, makes the rank Close its
	// Quorum and return errLeft instead of calling Done.
	leave func(step uint64, accepted bool) bool
	// nextCtx gives the context of Next after step last (default: ctx).
	nextCtx func(last uint64) (context.Context, context.CancelFunc)
	// afterNext is called when Next returned step.
	afterNext func(step uint64)
}

var errLeft = errors.New("left the run")

// train is a trainer's loop: Next, Submit, Done until the final release,
// whose state it copies into final.
func train(ctx context.Context, q *Quorum, steps uint64, rec *qRecord, h qHooks, final []float32) error {
	state := make([]float32, q.Len())
	contrib := make([]float32, q.Len())
	r := q.Rank()
	var last uint64
	for {
		nctx, cancel := ctx, context.CancelFunc(func() {})
		if h.nextCtx != nil {
			nctx, cancel = h.nextCtx(last)
		}
		step, err := q.Next(nctx, state)
		cancel()
		if err != nil {
			return err
		}
		if step <= last {
			return fmt.Errorf("Next returned step %d after %d", step, last)
		}
		last = step
		if h.afterNext != nil {
			h.afterNext(step)
		}
		if step > steps {
			if step != steps+1 {
				return fmt.Errorf("final release is step %d, want %d", step, steps+1)
			}
			copy(final, state)
			return nil
		}
		if h.beforeSubmit != nil {
			h.beforeSubmit(step)
		}
		qContrib(r, step, state, contrib)
		ok, err := q.Submit(ctx, step, contrib)
		if err != nil {
			return err
		}
		if ok {
			rec.accepted(step, r)
		}
		if h.leave != nil && h.leave(step, ok) {
			q.Close()
			return errLeft
		}
		if !ok {
			continue
		}
		if h.beforeDone != nil {
			h.beforeDone(step)
		}
		if err := q.Done(ctx, step); err != nil {
			return err
		}
	}
}

// joinQuorum forms a quorum run of n ranks on loopback; only rank 0 listens.
// mod, if not nil, edits each rank's config. The ranks are closed when the
// test ends.
func joinQuorum(t *testing.T, n, need int, steps uint64, mod func(*QuorumConfig)) []*Quorum {
	t.Helper()
	lns, addrs := listeners(t, 1)
	all := make([]string, n)
	all[0] = addrs[0]
	cfgs := make([]QuorumConfig, n)
	for r := range cfgs {
		cfgs[r] = QuorumConfig{
			Config: Config{Rank: r, Addrs: all, Job: "q", Generation: 1, Timeout: time.Second, JoinTimeout: 5 * time.Second},
			Need:   need, Steps: steps,
		}
		if r == 0 {
			cfgs[r].Listener, cfgs[r].Initial, cfgs[r].Update = lns[0], qInitial(), sgd
		}
		if mod != nil {
			mod(&cfgs[r])
		}
	}
	return mustJoinEach(t, cfgs, JoinQuorum)
}

// runQuorum runs train on every rank and returns the errors, the final
// states and how long each rank took.
func runQuorum(qs []*Quorum, steps uint64, rec *qRecord, hooks func(r int) qHooks) ([]error, [][]float32, []time.Duration) {
	n := len(qs)
	errs := make([]error, n)
	finals := make([][]float32, n)
	took := make([]time.Duration, n)
	var wg sync.WaitGroup
	for r, q := range qs {
		finals[r] = make([]float32, q.Len())
		var h qHooks
		if hooks != nil {
			h = hooks(r)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			errs[r] = train(context.Background(), q, steps, rec, h, finals[r])
			took[r] = time.Since(start)
		}()
	}
	wg.Wait()
	return errs, finals, took
}

// sameBits fails unless got equals want bit for bit.
func sameBits(t *testing.T, what string, got, want []float32) {
	t.Helper()
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("%s: element %d is %g, want %g", what, i, got[i], want[i])
		}
	}
}

// closeQuorums closes every rank's quorum and checks that none left a
// goroutine behind.
func closeQuorums(t *testing.T, qs []*Quorum) {
	t.Helper()
	for r, q := range qs {
		if err := q.Close(); err != nil {
			t.Errorf("close rank %d: %v", r, err)
		}
	}
	checkNoQuorumGoroutines(t)
}

// checkNoQuorumGoroutines waits for every goroutine of the quorum code to
// end.
func checkNoQuorumGoroutines(t *testing.T) {
	t.Helper()
	var stacks string
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		buf := make([]byte, 1<<20)
		stacks = string(buf[:runtime.Stack(buf, true)])
		leaked := false
		for g := range strings.SplitSeq(stacks, "\n\n") {
			if strings.Contains(g, "collective.(*coord)") || strings.Contains(g, "collective.(*Quorum)") || strings.Contains(g, "collective.(*joiner)") {
				leaked = true
			}
		}
		if !leaked {
			return
		}
	}
	t.Fatalf("quorum goroutines still running:\n%s", stacks)
}

// TestQuorumSync: with Need = N every contribution is accepted, and the run
// is synchronous averaging: the final state on every rank equals a naive
// recomputation bit for bit.
func TestQuorumSync(t *testing.T) {
	for n := 1; n <= 5; n++ {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			const steps = 8
			qs := joinQuorum(t, n, n, steps, nil)
			var rec qRecord
			errs, finals, _ := runQuorum(qs, steps, &rec, nil)
			noErrors(t, errs)
			for s := uint64(1); s <= steps; s++ {
				if len(rec.acc[s]) != n {
					t.Fatalf("step %d: accepted %v, want all %d ranks", s, rec.acc[s], n)
				}
			}
			want := rec.replay(t, steps, n)
			for r := range n {
				sameBits(t, fmt.Sprintf("rank %d final state", r), finals[r], want)
			}
			closeQuorums(t, qs)
		})
	}
}

// TestQuorumStraggler: N = 4, Need = 3, rank 3 sleeps before every Submit.
// The others go at their own speed, rank 3's contributions are (nearly all)
// rejected, and rank 3 still gets the final release and exits cleanly.
func TestQuorumStraggler(t *testing.T) {
	const n, need, steps, slow = 4, 3, 20, 40 * time.Millisecond
	qs := joinQuorum(t, n, need, steps, nil)
	var rec qRecord
	var closeErr error
	var closed time.Duration
	errs, finals, took := runQuorum(qs, steps, &rec, func(r int) qHooks {
		switch r {
		case 0: // closes as soon as it has the final release
			return qHooks{afterNext: func(step uint64) {
				if step > steps {
					start := time.Now()
					closeErr = qs[0].Close()
					closed = time.Since(start)
				}
			}}
		case 3:
			return qHooks{beforeSubmit: func(uint64) { time.Sleep(slow) }}
		}
		return qHooks{}
	})
	noErrors(t, errs)
	if closeErr != nil {
		t.Errorf("rank 0 Close: %v", closeErr)
	}
	t.Logf("rank 0's Close waited %s for the others to fetch the final release", closed.Round(time.Millisecond))
	want := rec.replay(t, steps, need)
	for r := range n {
		sameBits(t, fmt.Sprintf("rank %d final state", r), finals[r], want)
	}
	slowAccepted := 0
	for _, ranks := range rec.acc {
		if slices.Contains(ranks, 3) {
			slowAccepted++
		}
	}
	t.Logf("rank 3 accepted in %d of %d steps; fast ranks took %v, rank 3 %v", slowAccepted, steps, took[:3], took[3])
	if slowAccepted > steps/4 {
		t.Errorf("rank 3 was accepted in %d of %d steps", slowAccepted, steps)
	}
	for r := range 3 {
		if took[r] > steps*slow/2 {
			t.Errorf("rank %d took %s: it waited for the straggler", r, took[r])
		}
	}
	closeQuorums(t, qs)
}

// TestQuorumDoneOrdering: a step is released (and Update called) only after
// every accepted rank called Done, however late within Timeout.
func TestQuorumDoneOrdering(t *testing.T) {
	const n, need, steps = 4, 3, 12
	var mu sync.Mutex
	doneCalled := make(map[uint64]int) // step -> Done calls started
	var violations atomic.Int32
	checkStep := func(where string, step uint64) {
		mu.Lock()
		defer mu.Unlock()
		if doneCalled[step] != need {
			if violations.Add(1) < 5 {
				t.Errorf("%s: step %d had %d of %d Done calls", where, step, doneCalled[step], need)
			}
		}
	}
	qs := joinQuorum(t, n, need, steps, func(c *QuorumConfig) {
		if c.Rank == 0 {
			c.Update = func(step uint64, sum []float32, k int, state []float32) {
				checkStep("Update", step)
				sgd(step, sum, k, state)
			}
		}
	})
	var rec qRecord
	errs, _, _ := runQuorum(qs, steps, &rec, func(r int) qHooks {
		return qHooks{
			beforeDone: func(step uint64) {
				// The higher the rank, the longer its side effects take.
				time.Sleep(time.Duration(r) * 5 * time.Millisecond)
				mu.Lock()
				doneCalled[step]++
				mu.Unlock()
			},
			afterNext: func(step uint64) {
				if step > 1 {
					checkStep(fmt.Sprintf("rank %d got step %d", r, step), step-1)
				}
			},
		}
	})
	noErrors(t, errs)
	if v := violations.Load(); v > 0 {
		t.Fatalf("%d ordering violations", v)
	}
}

// TestQuorumRankLeaves: N = 4, Need = 3; rank 3 leaves (closes) right after
// an accepted Submit, without Done. Its contribution counts, the step is
// released without its Done, and the others finish the run.
func TestQuorumRankLeaves(t *testing.T) {
	const n, need, steps, leaveFrom = 4, 3, 10, 4
	qs := joinQuorum(t, n, need, steps, nil)
	var rec qRecord
	var left atomic.Uint64
	errs, finals, _ := runQuorum(qs, steps, &rec, func(r int) qHooks {
		switch r {
		case 3:
			return qHooks{leave: func(step uint64, accepted bool) bool {
				if step >= leaveFrom && accepted {
					left.Store(step)
					return true
				}
				return false
			}}
		case 2: // slow, so that rank 3 is soon among the first Need
			return qHooks{beforeSubmit: func(step uint64) {
				if step >= leaveFrom {
					time.Sleep(50 * time.Millisecond)
				}
			}}
		}
		return qHooks{}
	})
	if !errors.Is(errs[3], errLeft) {
		t.Fatalf("rank 3: %v", errs[3])
	}
	noErrors(t, errs[:3])
	t.Logf("rank 3 left after its accepted Submit for step %d", left.Load())
	want := rec.replay(t, steps, need)
	for r := range 3 {
		sameBits(t, fmt.Sprintf("rank %d final state", r), finals[r], want)
	}
	closeQuorums(t, qs)
}

// TestQuorumCancelLeaves: rank 2's Next is cancelled while the step it waits
// for is held up by a slow Done; rank 2 leaves the run, the other two
// (Need = 2) finish it.
func TestQuorumCancelLeaves(t *testing.T) {
	const n, need, steps, at = 3, 2, 6, 3
	qs := joinQuorum(t, n, need, steps, nil)
	var rec qRecord
	errs, finals, _ := runQuorum(qs, steps, &rec, func(r int) qHooks {
		if r == 2 {
			return qHooks{nextCtx: func(last uint64) (context.Context, context.CancelFunc) {
				if last >= at {
					return context.WithTimeout(context.Background(), 50*time.Millisecond)
				}
				return context.Background(), func() {}
			}}
		}
		return qHooks{beforeDone: func(step uint64) {
			if step >= at && step < at+2 {
				time.Sleep(300 * time.Millisecond)
			}
		}}
	})
	if !errors.Is(errs[2], context.DeadlineExceeded) || !errors.Is(errs[2], ErrGroupBroken) {
		t.Errorf("rank 2: %v, want DeadlineExceeded and ErrGroupBroken", errs[2])
	}
	noErrors(t, errs[:2])
	want := rec.replay(t, steps, need)
	for r := range 2 {
		sameBits(t, fmt.Sprintf("rank %d final state", r), finals[r], want)
	}
	if _, err := qs[2].Next(context.Background(), make([]float32, qLen)); !errors.Is(err, ErrGroupBroken) {
		t.Errorf("rank 2 after leaving: %v, want ErrGroupBroken", err)
	}
}

// TestQuorumLost: ranks leave until fewer than Need are left: every other
// rank fails quickly with ErrQuorumLost, rank 0's error names the lost rank,
// and no goroutine is left behind.
func TestQuorumLost(t *testing.T) {
	cases := []struct {
		n, need int
		leave   []int
	}{
		{3, 3, []int{2}},
		{4, 3, []int{1, 3}},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("n%d_need%d", tc.n, tc.need), func(t *testing.T) {
			const steps, at = 10, 3
			qs := joinQuorum(t, tc.n, tc.need, steps, nil)
			var rec qRecord
			errs, _, took := runQuorum(qs, steps, &rec, func(r int) qHooks {
				if slices.Contains(tc.leave, r) {
					return qHooks{leave: func(step uint64, _ bool) bool { return step >= at }}
				}
				return qHooks{}
			})
			for r, err := range errs {
				if slices.Contains(tc.leave, r) {
					if !errors.Is(err, errLeft) {
						t.Errorf("rank %d: %v", r, err)
					}
					continue
				}
				t.Logf("rank %d after %s: %v", r, took[r].Round(time.Millisecond), err)
				if !errors.Is(err, ErrQuorumLost) || !errors.Is(err, ErrGroupBroken) {
					t.Errorf("rank %d: %v, want ErrQuorumLost and ErrGroupBroken", r, err)
				}
				if took[r] > 2*time.Second {
					t.Errorf("rank %d failed after %s", r, took[r])
				}
			}
			var pe *PeerError
			if !errors.As(errs[0], &pe) || !slices.Contains(tc.leave, pe.Peer) {
				t.Errorf("rank 0: %v does not name a lost rank", errs[0])
			}
			for _, q := range qs {
				if _, err := q.Next(context.Background(), make([]float32, qLen)); !errors.Is(err, ErrGroupBroken) && !errors.Is(err, ErrClosed) {
					t.Errorf("rank %d after the failure: %v", q.Rank(), err)
				}
				q.Close()
			}
			checkNoQuorumGoroutines(t)
		})
	}
}

// TestQuorumStall: rank 2 stays connected but never submits. With Need = 3
// the step cannot complete: everyone fails after StepTimeout, including
// rank 2 when it finally calls.
func TestQuorumStall(t *testing.T) {
	const stepTimeout = 300 * time.Millisecond
	qs := joinQuorum(t, 3, 3, 5, func(c *QuorumConfig) { c.StepTimeout = stepTimeout })
	var rec qRecord
	errs, _, took := runQuorum(qs[:2], 5, &rec, nil)
	for r, err := range errs {
		t.Logf("rank %d after %s: %v", r, took[r].Round(time.Millisecond), err)
		if !errors.Is(err, ErrQuorumLost) || !strings.Contains(err.Error(), "StepTimeout") {
			t.Errorf("rank %d: %v, want ErrQuorumLost after StepTimeout", r, err)
		}
		if took[r] > stepTimeout+time.Second {
			t.Errorf("rank %d failed after %s", r, took[r])
		}
	}
	_, err := qs[2].Next(context.Background(), make([]float32, qLen))
	if !errors.Is(err, ErrGroupBroken) {
		t.Errorf("rank 2: %v, want ErrGroupBroken", err)
	}
	t.Logf("rank 2: %v", err)
}

// TestQuorumLateDone: a rank that does not call Done within Timeout of its
// accepted Submit is dropped (its Done fails and says why); its contribution
// counts and the others finish.
func TestQuorumLateDone(t *testing.T) {
	const n, need, steps, timeout = 3, 2, 6, 300 * time.Millisecond
	qs := joinQuorum(t, n, need, steps, func(c *QuorumConfig) { c.Timeout = timeout })
	var rec qRecord
	var slept atomic.Bool
	errs, finals, _ := runQuorum(qs, steps, &rec, func(r int) qHooks {
		if r != 1 { // slow until rank 1 had an accepted Submit
			return qHooks{beforeSubmit: func(uint64) {
				if !slept.Load() {
					time.Sleep(20 * time.Millisecond)
				}
			}}
		}
		return qHooks{beforeDone: func(step uint64) {
			if !slept.Swap(true) {
				time.Sleep(2 * timeout)
			}
		}}
	})
	if !errors.Is(errs[1], ErrGroupBroken) || !strings.Contains(errs[1].Error(), "did not call Done") {
		t.Errorf("rank 1: %v, want a drop for a late Done", errs[1])
	}
	t.Logf("rank 1: %v", errs[1])
	noErrors(t, []error{errs[0], errs[2]})
	want := rec.replay(t, steps, need)
	sameBits(t, "rank 0 final state", finals[0], want)
	sameBits(t, "rank 2 final state", finals[2], want)
}
