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

// makeGroup forms a group of n ranks on loopback. mod, if not nil, edits
// each rank's Config. The groups are closed when the test ends.
func makeGroup(t testing.TB, n int, mod func(*Config)) []*Group {
	t.Helper()
	lns, addrs := listeners(t, n)
	gs := make([]*Group, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		cfg := Config{Rank: r, Addrs: addrs, Job: "test", Generation: 1, Listener: lns[r], JoinTimeout: 10 * time.Second, Timeout: 5 * time.Second}
		if mod != nil {
			mod(&cfg)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			gs[r], errs[r] = Join(context.Background(), cfg)
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("join rank %d: %v", r, err)
		}
	}
	t.Cleanup(func() {
		for _, g := range gs {
			g.Close()
		}
	})
	return gs
}

// onAll runs f on every rank concurrently and returns each rank's error.
func onAll(gs []*Group, f func(r int, g *Group) error) []error {
	errs := make([]error, len(gs))
	var wg sync.WaitGroup
	for r, g := range gs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = f(r, g)
		}()
	}
	wg.Wait()
	return errs
}

func noErrors(t testing.TB, errs []error) {
	t.Helper()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
}
