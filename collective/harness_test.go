package collective

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"
)

// listeners reserves n loopback ports and returns their listeners and
// addresses.
func listeners(t testing.TB, n int) ([]net.Listener, []string) {
	t.Helper()
	lns := make([]net.Listener, n)
	addrs := make([]string, n)
	for i := range lns {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns[i], addrs[i] = ln, ln.Addr().String()
	}
	return lns, addrs
}

// eachRank runs f for every rank 0..n-1 concurrently and returns each
// rank's error once all have returned.
func eachRank(n int, f func(r int) error) []error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() { errs[r] = f(r) })
	}
	wg.Wait()
	return errs
}

// joinEach joins with every rank's config concurrently, as the processes
// of a job do (join is Join or JoinQuorum), and returns what each returned.
func joinEach[C, T any](cfgs []C, join func(context.Context, C) (T, error)) ([]T, []error) {
	out := make([]T, len(cfgs))
	errs := eachRank(len(cfgs), func(r int) error {
		var err error
		out[r], err = join(context.Background(), cfgs[r])
		return err
	})
	return out, errs
}

// mustJoinEach joins every rank concurrently, fails the test if any join
// fails, and closes them all when the test ends.
func mustJoinEach[C, T any, P interface {
	*T
	Close() error
}](t testing.TB, cfgs []C, join func(context.Context, C) (P, error)) []P {
	t.Helper()
	ps, errs := joinEach(cfgs, join)
	t.Cleanup(func() { closeAll(ps) })
	for r, err := range errs {
		if err != nil {
			t.Fatalf("join rank %d: %v", r, err)
		}
	}
	return ps
}

// closeAll closes the groups or quorum runs that were formed.
func closeAll[T any, P interface {
	*T
	Close() error
}](ps []P) {
	for _, p := range ps {
		if p != nil {
			p.Close()
		}
	}
}

// makeGroup forms a group of n ranks on loopback. mod, if not nil, edits
// each rank's Config. The groups are closed when the test ends.
func makeGroup(t testing.TB, n int, mod func(*Config)) []*Group {
	t.Helper()
	lns, addrs := listeners(t, n)
	cfgs := make([]Config, n)
	for r := range cfgs {
		cfgs[r] = Config{Rank: r, Addrs: addrs, Job: "test", Generation: 1, Listener: lns[r], JoinTimeout: 10 * time.Second, Timeout: 5 * time.Second}
		if mod != nil {
			mod(&cfgs[r])
		}
	}
	return mustJoinEach(t, cfgs, Join)
}

// onAll runs f on every rank concurrently and returns each rank's error.
func onAll(gs []*Group, f func(r int, g *Group) error) []error {
	return eachRank(len(gs), func(r int) error { return f(r, gs[r]) })
}

func noErrors(t testing.TB, errs []error) {
	t.Helper()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
}
