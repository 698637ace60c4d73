package shard

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"
)

// TestCoalescer checks the two properties chain reads rely on: a caller is
// answered by a run that started after it called (never one already under
// way, whose answer may predate it), and callers that arrive while a run is
// under way share one next run.
func TestCoalescer(t *testing.T) {
	release := make(chan struct{})
	var mu sync.Mutex
	var runs [][]int
	c := &coalescer[int, string]{fn: func(qs []int) (map[int]string, error) {
		mu.Lock()
		runs = append(runs, slices.Sorted(slices.Values(qs)))
		first := len(runs) == 1
		mu.Unlock()
		if first {
			<-release
		}
		out := map[int]string{}
		for _, q := range qs {
			out[q] = fmt.Sprint("answer ", q)
		}
		return out, nil
	}}
	spawn := func(f func()) bool { go f(); return true }
	ctx := context.Background()

	firstDone := make(chan error, 1)
	go func() {
		a, _, err := c.do(ctx, 0, spawn)
		if err == nil && a != "answer 0" {
			err = fmt.Errorf("answer %q", a)
		}
		firstDone <- err
	}()
	for { // wait until the first run is under way
		mu.Lock()
		n := len(runs)
		mu.Unlock()
		if n == 1 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 10)
	for q := 1; q <= 10; q++ {
		wg.Go(func() {
			asked := time.Now()
			a, started, err := c.do(ctx, q, spawn)
			switch {
			case err != nil:
				errs <- err
			case a != fmt.Sprint("answer ", q):
				errs <- fmt.Errorf("question %d answered %q", q, a)
			case started.Before(asked):
				errs <- fmt.Errorf("question %d answered by a run that started %s before it was asked", q, asked.Sub(started))
			}
		})
	}
	// The ten join the next run while the first is blocked.
	for {
		c.mu.Lock()
		n := 0
		if c.next != nil {
			n = len(c.next.qs)
		}
		c.mu.Unlock()
		if n == 10 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	close(release)
	if err := <-firstDone; err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	mu.Lock()
	if len(runs) != 2 || !slices.Equal(runs[0], []int{0}) || len(runs[1]) != 10 {
		t.Errorf("runs %v, want [[0] [1 ... 10]]", runs)
	}
	mu.Unlock()
	// Idle again: a new caller starts a run of its own.
	if a, _, err := c.do(ctx, 42, spawn); err != nil || a != "answer 42" {
		t.Errorf("after the batch: %q, %v", a, err)
	}
}
