package collective

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// The quorum when its coordinator fails, its input is bad, or joining
// goes wrong; the happy path and the ranks' failures are in quorum_test.go.

// TestQuorumCoordinatorCrash: rank 0 dies (its connections close without a
// word) in the middle of the run: the others fail at once with a PeerError
// naming rank 0.
func TestQuorumCoordinatorCrash(t *testing.T) {
	const n, need, steps, timeout = 3, 3, 10, 500 * time.Millisecond
	qs := joinQuorum(t, n, need, steps, func(c *QuorumConfig) { c.Timeout = timeout })
	var rec qRecord
	var crashed time.Time
	crash := qHooks{afterNext: func(step uint64) {
		if step >= 4 && crashed.IsZero() {
			crashed = time.Now()
			qs[0].co.teardown()
		}
	}}
	errs, _, _ := runQuorum(qs, steps, &rec, func(r int) qHooks {
		if r == 1 { // rank 1 crashes rank 0, so it sees the crash at once
			return crash
		}
		return qHooks{}
	})
	for r := 1; r < n; r++ {
		var pe *PeerError
		if !errors.As(errs[r], &pe) || pe.Peer != 0 || !errors.Is(errs[r], ErrPeerFailed) || !errors.Is(errs[r], ErrGroupBroken) {
			t.Errorf("rank %d: %v, want a PeerError naming rank 0", r, errs[r])
		}
	}
	if d := time.Since(crashed); d > timeout+time.Second {
		t.Errorf("the ranks failed %s after the crash", d)
	}
	t.Logf("rank 0: %v\nrank 1: %v", errs[0], errs[1])
}

// TestQuorumCoordinatorClosesEarly: rank 0 closes before the final release:
// the others fail at once, saying so.
func TestQuorumCoordinatorClosesEarly(t *testing.T) {
	const n, need, steps = 3, 3, 10 // Need = N: no rank skips a step
	qs := joinQuorum(t, n, need, steps, nil)
	var rec qRecord
	errs, _, took := runQuorum(qs, steps, &rec, func(r int) qHooks {
		if r != 0 {
			return qHooks{}
		}
		return qHooks{afterNext: func(step uint64) {
			if step >= 3 {
				qs[0].Close()
			}
		}}
	})
	if !errors.Is(errs[0], ErrClosed) {
		t.Errorf("rank 0: %v, want ErrClosed", errs[0])
	}
	for r := 1; r < n; r++ {
		if !errors.Is(errs[r], ErrGroupBroken) || !strings.Contains(errs[r].Error(), "closed the run at step") {
			t.Errorf("rank %d: %v", r, errs[r])
		}
		if took[r] > time.Second {
			t.Errorf("rank %d failed after %s", r, took[r])
		}
	}
	t.Logf("rank 1: %v", errs[1])
}

// fakeCoordinator accepts one rank, starts the run and then never answers.
func fakeCoordinator(t *testing.T, ln net.Listener, cfg QuorumConfig) {
	t.Helper()
	cfg, err := cfg.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	cfg.Rank, cfg.Initial = 0, make([]float32, qLen)
	hs := quorumHandshake(&cfg)
	done := make(chan struct{})
	t.Cleanup(func() { <-done })
	go func() {
		defer close(done)
		defer ln.Close()
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		if _, err := quorumHello.read(c); err != nil {
			return
		}
		reply := hs.hello(1, statusOK, "")
		c.Write(quorumHello.marshal(&reply))
		qc := &qconn{conn: c}
		qc.write(context.Background(), time.Now().Add(time.Second), qheader{typ: qStart}, nil, "")
		buf := make([]byte, 4096)
		for { // swallow the requests until the rank hangs up
			if _, err := c.Read(buf); err != nil {
				return
			}
		}
	}()
}

// TestQuorumCoordinatorSilent: rank 0 is connected but stops answering: a
// waiting Next fails within Timeout; a cancelled one at once.
func TestQuorumCoordinatorSilent(t *testing.T) {
	const timeout = 300 * time.Millisecond
	for _, cancel := range []bool{false, true} {
		t.Run(fmt.Sprintf("cancel=%v", cancel), func(t *testing.T) {
			lns, addrs := listeners(t, 1)
			cfg := QuorumConfig{Config: Config{Rank: 1, Addrs: []string{addrs[0], ""}, Timeout: timeout, JoinTimeout: 2 * time.Second}, Need: 2, Steps: 3}
			if cancel {
				cfg.Timeout = 10 * time.Second
			}
			fakeCoordinator(t, lns[0], cfg)
			q, err := JoinQuorum(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer q.Close()
			ctx := context.Background()
			if cancel {
				var stop context.CancelFunc
				ctx, stop = context.WithCancel(ctx)
				time.AfterFunc(50*time.Millisecond, stop)
			}
			start := time.Now()
			_, err = q.Next(ctx, make([]float32, qLen))
			took := time.Since(start)
			t.Logf("after %s: %v", took.Round(time.Millisecond), err)
			var pe *PeerError
			switch {
			case cancel && !errors.Is(err, context.Canceled):
				t.Errorf("%v, want context.Canceled", err)
			case !cancel && (!errors.As(err, &pe) || pe.Peer != 0 || !strings.Contains(err.Error(), "did not answer")):
				t.Errorf("%v, want a PeerError: rank 0 did not answer", err)
			case took > timeout+time.Second:
				t.Errorf("failed after %s", took)
			}
		})
	}
}

// TestQuorumBadInput: misuse fails with a clear error and leaves the run
// usable; the run then ends normally.
func TestQuorumBadInput(t *testing.T) {
	const steps = 2
	qs := joinQuorum(t, 2, 2, steps, nil)
	ctx := context.Background()
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r, q := range qs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = func() error {
				state := make([]float32, qLen)
				expect := func(what string, err, want error, text string) error {
					if !errors.Is(err, want) || !strings.Contains(err.Error(), text) {
						return fmt.Errorf("%s: %v, want %v mentioning %q", what, err, want, text)
					}
					return nil
				}
				checks := []func() error{
					func() error {
						_, err := q.Submit(ctx, 1, state)
						return expect("Submit before Next", err, ErrConfig, "never released")
					},
					func() error { return expect("Done before Next", q.Done(ctx, 1), ErrConfig, "no accepted Submit") },
					func() error {
						_, err := q.Next(ctx, state[:5])
						return expect("Next with a short buffer", err, ErrConfig, "5 elements")
					},
				}
				for _, c := range checks {
					if err := c(); err != nil {
						return err
					}
				}
				for s := uint64(1); s <= steps; s++ {
					step, err := q.Next(ctx, state)
					if err != nil || step != s {
						return fmt.Errorf("Next: step %d, %v; want step %d", step, err, s)
					}
					checks := []func() error{
						func() error {
							_, err := q.Submit(ctx, s+1, state)
							return expect("Submit of a future step", err, ErrConfig, "never released")
						},
						func() error {
							_, err := q.Submit(ctx, s, state[1:])
							return expect("Submit with a short buffer", err, ErrConfig, "999 elements")
						},
					}
					for _, c := range checks {
						if err := c(); err != nil {
							return err
						}
					}
					if ok, err := q.Submit(ctx, s, state); !ok || err != nil {
						return fmt.Errorf("Submit: %v, %v", ok, err)
					}
					checks = []func() error{
						func() error {
							_, err := q.Submit(ctx, s, state)
							return expect("second Submit", err, ErrConfig, "already submitted")
						},
						func() error {
							_, err := q.Next(ctx, state)
							return expect("Next before Done", err, ErrConfig, "Done")
						},
						func() error { return expect("Done of another step", q.Done(ctx, s+1), ErrConfig, "no accepted Submit") },
					}
					for _, c := range checks {
						if err := c(); err != nil {
							return err
						}
					}
					if err := q.Done(ctx, s); err != nil {
						return err
					}
					if err := expect("second Done", q.Done(ctx, s), ErrConfig, "already called"); err != nil {
						return err
					}
				}
				step, err := q.Next(ctx, state)
				if err != nil || step != steps+1 {
					return fmt.Errorf("final Next: step %d, %v", step, err)
				}
				if _, err := q.Submit(ctx, step, state); !errors.Is(err, ErrFinished) {
					return fmt.Errorf("Submit of the final release: %v, want ErrFinished", err)
				}
				if _, err := q.Next(ctx, state); !errors.Is(err, ErrFinished) {
					return fmt.Errorf("Next after the final release: %v, want ErrFinished", err)
				}
				return nil
			}()
		}()
	}
	wg.Wait()
	noErrors(t, errs)
	for r, q := range qs {
		if err := q.Close(); err != nil {
			t.Errorf("close rank %d: %v", r, err)
		}
	}
}

// TestQuorumBusy: a call started while another is running fails with ErrBusy.
func TestQuorumBusy(t *testing.T) {
	qs := joinQuorum(t, 2, 2, 3, nil)
	ctx := context.Background()
	state := make([]float32, qLen)
	if _, err := qs[1].Next(ctx, state); err != nil {
		t.Fatal(err)
	}
	if _, err := qs[1].Submit(ctx, 1, state); err != nil {
		t.Fatal(err)
	}
	if err := qs[1].Done(ctx, 1); err != nil {
		t.Fatal(err)
	}
	// Rank 0 has not submitted: rank 1's Next waits.
	next := make(chan error)
	go func() {
		_, err := qs[1].Next(ctx, make([]float32, qLen))
		next <- err
	}()
	for qs[1].op.TryLock() {
		qs[1].op.Unlock()
		time.Sleep(time.Millisecond)
	}
	if _, err := qs[1].Submit(ctx, 1, state); !errors.Is(err, ErrBusy) {
		t.Errorf("concurrent Submit: %v, want ErrBusy", err)
	}
	qs[1].Close()
	if err := <-next; !errors.Is(err, ErrClosed) {
		t.Errorf("Next interrupted by Close: %v, want ErrClosed", err)
	}
}

func TestQuorumConfigErrors(t *testing.T) {
	base := func(r int) QuorumConfig {
		c := QuorumConfig{Config: Config{Rank: r, Addrs: []string{"127.0.0.1:1", ""}}, Need: 2, Steps: 1}
		if r == 0 {
			c.Initial, c.Update = []float32{1}, sgd
		}
		return c
	}
	cases := []struct {
		mod  func(*QuorumConfig)
		want string
	}{
		{func(c *QuorumConfig) { c.Need = 0 }, "Need (0)"},
		{func(c *QuorumConfig) { c.Need = 3 }, "Need (3)"},
		{func(c *QuorumConfig) { c.Steps = 0 }, "Steps is 0"},
		{func(c *QuorumConfig) { c.Initial = nil }, "needs Initial"},
		{func(c *QuorumConfig) { c.Update = nil }, "needs Update"},
		{func(c *QuorumConfig) { c.StepTimeout = -1 }, "StepTimeout"},
		{func(c *QuorumConfig) { c.Addrs = nil }, "Addrs is empty"},
	}
	for _, tc := range cases {
		c := base(0)
		tc.mod(&c)
		if _, err := JoinQuorum(context.Background(), c); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want ErrConfig mentioning %q", tc.want, err, tc.want)
		}
	}
}

// TestQuorumJoinRefused: a rank whose settings differ from rank 0's is
// refused at once; rank 0 times out saying why.
func TestQuorumJoinRefused(t *testing.T) {
	cases := []struct {
		name string
		mod  func(*QuorumConfig)
		want string
	}{
		{"length", func(c *QuorumConfig) { c.Initial = make([]float32, qLen+1) }, "expects a state of 1001 elements"},
		{"need", func(c *QuorumConfig) { c.Need = 1 }, "Need 1"},
		{"steps", func(c *QuorumConfig) { c.Steps = 9 }, "Steps 9"},
		{"job", func(c *QuorumConfig) { c.Job = "other" }, `job "other"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			lns, addrs := listeners(t, 1)
			all := []string{addrs[0], ""}
			cfgs := make([]QuorumConfig, 2)
			for r := range cfgs {
				cfgs[r] = QuorumConfig{Config: Config{Rank: r, Addrs: all, Job: "q", JoinTimeout: 500 * time.Millisecond}, Need: 2, Steps: 3}
			}
			cfgs[0].Listener, cfgs[0].Initial, cfgs[0].Update = lns[0], qInitial(), sgd
			tc.mod(&cfgs[1])
			qs, errs := joinEach(cfgs, JoinQuorum)
			closeAll(qs)
			if !errors.Is(errs[1], ErrRefused) || !strings.Contains(errs[1].Error(), tc.want) {
				t.Errorf("rank 1: %v, want ErrRefused mentioning %q", errs[1], tc.want)
			}
			if !errors.Is(errs[0], ErrJoinTimeout) || !strings.Contains(errs[0].Error(), tc.want) {
				t.Errorf("rank 0: %v, want ErrJoinTimeout mentioning %q", errs[0], tc.want)
			}
		})
	}
}

// TestQuorumJoinTimeout: a rank whose peers never all come is told so by
// rank 0 instead of waiting for its own JoinTimeout.
func TestQuorumJoinTimeout(t *testing.T) {
	lns, addrs := listeners(t, 1)
	all := []string{addrs[0], "", ""}
	cfgs := make([]QuorumConfig, 2) // rank 2 never comes
	for r := range cfgs {
		cfgs[r] = QuorumConfig{Config: Config{Rank: r, Addrs: all, JoinTimeout: 300 * time.Millisecond}, Need: 2, Steps: 3}
	}
	cfgs[0].Listener, cfgs[0].Initial, cfgs[0].Update = lns[0], qInitial(), sgd
	cfgs[1].JoinTimeout = 10 * time.Second
	took, errs := joinEach(cfgs, func(ctx context.Context, cfg QuorumConfig) (time.Duration, error) {
		start := time.Now()
		q, err := JoinQuorum(ctx, cfg)
		if q != nil {
			q.Close()
		}
		return time.Since(start), err
	})
	for r, err := range errs {
		t.Logf("rank %d after %s: %v", r, took[r].Round(time.Millisecond), err)
		if !errors.Is(err, ErrJoinTimeout) || !strings.Contains(err.Error(), "rank(s) 2") {
			t.Errorf("rank %d: %v, want ErrJoinTimeout naming rank 2", r, err)
		}
		if took[r] > 2*time.Second {
			t.Errorf("rank %d took %s", r, took[r])
		}
	}
	checkNoQuorumGoroutines(t)
}

// TestQuorumCloseBounded: rank 0's Close after the final release waits at
// most Timeout for a rank that never fetches it, and names that rank; the
// rank then learns why.
func TestQuorumCloseBounded(t *testing.T) {
	const timeout = 300 * time.Millisecond
	qs := joinQuorum(t, 2, 1, 1, func(c *QuorumConfig) { c.Timeout = timeout })
	var rec qRecord
	final := make([]float32, qLen)
	if err := train(context.Background(), qs[0], 1, &rec, qHooks{}, final); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	closeErr := qs[0].Close()
	took := time.Since(start)
	if !errors.Is(closeErr, ErrPeerFailed) || !strings.Contains(closeErr.Error(), "rank(s) 1 did not fetch") {
		t.Errorf("Close: %v, want an error naming rank 1", closeErr)
	}
	if took < timeout/2 || took > timeout+time.Second {
		t.Errorf("Close took %s, Timeout is %s", took, timeout)
	}
	_, err := qs[1].Next(context.Background(), make([]float32, qLen))
	if !errors.Is(err, ErrGroupBroken) || !strings.Contains(err.Error(), "did not fetch the final release") {
		t.Errorf("rank 1: %v", err)
	}
	t.Logf("Close after %s: %v\nrank 1: %v", took.Round(time.Millisecond), closeErr, err)
	checkNoQuorumGoroutines(t)
}
