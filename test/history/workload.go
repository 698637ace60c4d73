package history

import (
	"context"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/raftps/raftps/shard/client"
)

// Store is what a Workload calls: a raftps client (*client.Client).
type Store interface {
	Push(ctx context.Context, table string, keys []uint64, grads []float32) error
	Pull(ctx context.Context, table string, keys []uint64, out []float32, opts ...client.PullOption) error
}

// Workload is one client's share of the checked workload: until stopped, it
// pushes (half the time) or pulls 1-3 distinct keys of Keys, each push a
// gradient of 1-3 on every element of a row (the model's positive
// integers), and records every call.
type Workload struct {
	Table  string
	Level  string // recorded with each op
	Dim    int
	Keys   []uint64
	Client int
	Seed   uint64
	// Definite reports whether a failed push was surely not applied (a
	// refusal of malformed input); any other failure is Unknown. Nil: all
	// failures are Unknown.
	Definite func(error) bool
	// Timeout bounds each call (default 10s).
	Timeout time.Duration
	// PullOnly makes the client a reader: it only pulls, so that how long
	// reads stay unanswered does not depend on writes that wait out a
	// failover.
	PullOnly bool
}

// Run runs the workload against s, recording into rec, until stop closes.
func (w Workload) Run(s Store, rec *Recorder, stop <-chan struct{}) {
	rng := rand.New(rand.NewPCG(w.Seed, uint64(w.Client)))
	timeout := w.Timeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	for {
		select {
		case <-stop:
			return
		default:
		}
		n := min(1+rng.IntN(3), len(w.Keys))
		ks := make([]uint64, 0, n)
		for len(ks) < n {
			if k := w.Keys[rng.IntN(len(w.Keys))]; !slices.Contains(ks, k) {
				ks = append(ks, k)
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		if !w.PullOnly && rng.IntN(2) == 0 {
			grads := make([]int64, n)
			vec := make([]float32, w.Dim*n)
			for i := range grads {
				grads[i] = int64(1 + rng.IntN(3))
				for j := range w.Dim {
					vec[i*w.Dim+j] = float32(grads[i])
				}
			}
			p := rec.InvokeLevel(w.Client, Push, w.Level, ks, grads)
			if err := s.Push(ctx, w.Table, ks, vec); err != nil {
				p.Fail(w.Definite != nil && w.Definite(err), err)
			} else {
				p.OK(nil)
			}
		} else {
			out := make([]float32, w.Dim*n)
			p := rec.InvokeLevel(w.Client, Pull, w.Level, ks, nil)
			if err := s.Pull(ctx, w.Table, ks, out); err != nil {
				p.Fail(true, err) // a pull changes nothing
			} else {
				vals := make([]int64, n)
				for i := range vals {
					vals[i] = int64(out[i*w.Dim])
				}
				p.OK(vals)
			}
		}
		cancel()
	}
}
