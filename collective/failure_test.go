package collective

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// checkPeerErrors: every rank except skip failed with a *PeerError naming a
// peer, within limit.
func checkPeerErrors(t *testing.T, errs []error, elapsed []time.Duration, skip int, limit time.Duration) {
	t.Helper()
	for r, err := range errs {
		if r == skip {
			continue
		}
		var pe *PeerError
		switch {
		case err == nil:
			t.Errorf("rank %d: no error", r)
		case !errors.As(err, &pe) || !errors.Is(err, ErrPeerFailed):
			t.Errorf("rank %d: %v is not a PeerError wrapping ErrPeerFailed", r, err)
		case !strings.Contains(err.Error(), "peer rank"):
			t.Errorf("rank %d: %q does not name the peer", r, err)
		}
		if elapsed[r] > limit {
			t.Errorf("rank %d: failed after %s, more than %s", r, elapsed[r], limit)
		}
		t.Logf("rank %d after %s: %v", r, elapsed[r].Round(time.Millisecond), err)
	}
}

// TestPeerClosedMidAllReduce: rank 2 closes its group in the middle of the
// ring of a 16 MiB buffer (after its first received chunk of step 1).
// Every other rank must fail with an error naming a peer, quickly, and the
// group must be broken afterwards.
func TestPeerClosedMidAllReduce(t *testing.T) {
	const n, timeout = 4, 2 * time.Second
	gs := makeGroup(t, n, func(c *Config) { c.Timeout = timeout; c.Algorithm = Ring; c.ChunkBytes = 64 << 10 })
	var once sync.Once
	testHookRecv = func(g *Group, step int) {
		if g == gs[2] && step == 1 {
			once.Do(func() { g.Close() })
		}
	}
	t.Cleanup(func() { testHookRecv = nil })
	elapsed := make([]time.Duration, n)
	errs := onAll(gs, func(r int, g *Group) error {
		start := time.Now()
		err := g.AllReduce(context.Background(), make([]float32, 4<<20), Sum)
		elapsed[r] = time.Since(start)
		return err
	})
	if !errors.Is(errs[2], ErrClosed) {
		t.Errorf("closed rank 2: %v, want ErrClosed", errs[2])
	}
	checkPeerErrors(t, errs, elapsed, 2, timeout)
	for r, g := range gs {
		if r == 2 {
			continue
		}
		if err := g.Barrier(context.Background()); !errors.Is(err, ErrGroupBroken) {
			t.Errorf("rank %d after failure: %v, want ErrGroupBroken", r, err)
		}
	}
}

// TestPeerSilent: rank 3 never calls AllReduce (it hangs, or its process is
// stopped). The others must fail within Timeout plus a margin, not hang.
func TestPeerSilent(t *testing.T) {
	const n, timeout = 4, 500 * time.Millisecond
	for _, algo := range []Algorithm{Ring, RecursiveDoubling} {
		t.Run(algo.String(), func(t *testing.T) {
			gs := makeGroup(t, n, func(c *Config) { c.Timeout = timeout; c.Algorithm = algo })
			elapsed := make([]time.Duration, n)
			errs := onAll(gs[:n-1], func(r int, g *Group) error {
				start := time.Now()
				err := g.AllReduce(context.Background(), make([]float32, 100000), Sum)
				elapsed[r] = time.Since(start)
				return err
			})
			checkPeerErrors(t, append(errs, nil), elapsed, n-1, timeout+time.Second)
		})
	}
}

// TestLinkCut: one connection (rank 1 to rank 2) is closed under the group,
// as a network failure would, during a loop of barriers and allreduces
// (both use the link 1-2 with N = 4).
func TestLinkCut(t *testing.T) {
	const n = 4
	gs := makeGroup(t, n, func(c *Config) { c.Timeout = time.Second })
	elapsed := make([]time.Duration, n)
	errs := onAll(gs, func(r int, g *Group) error {
		for i := range 100 {
			start := time.Now()
			if r == 1 && i == 50 {
				g.peers[2].conn.Close()
			}
			err := g.Barrier(context.Background())
			if err == nil {
				err = g.AllReduce(context.Background(), make([]float32, 100000), Sum)
			}
			if err != nil {
				elapsed[r] = time.Since(start)
				return err
			}
		}
		return nil
	})
	checkPeerErrors(t, errs, elapsed, -1, 2*time.Second)
}

func TestCancel(t *testing.T) {
	gs := makeGroup(t, 3, nil)
	ctx, cancel := context.WithCancel(context.Background())
	// Rank 2 never joins the operation, so the others block until cancelled.
	time.AfterFunc(50*time.Millisecond, cancel)
	errs := onAll(gs[:2], func(r int, g *Group) error {
		return g.AllReduce(ctx, make([]float32, 10), Sum)
	})
	for r, err := range errs {
		if !errors.Is(err, context.Canceled) {
			t.Errorf("rank %d: %v, want context.Canceled", r, err)
		}
	}
	if err := gs[0].Barrier(context.Background()); !errors.Is(err, ErrGroupBroken) {
		t.Errorf("after cancel: %v, want ErrGroupBroken", err)
	}
}

func TestBusy(t *testing.T) {
	gs := makeGroup(t, 2, nil)
	done := make(chan error)
	go func() { done <- gs[0].Barrier(context.Background()) }()
	// Wait until rank 0's barrier holds the operation lock.
	for gs[0].op.TryLock() {
		gs[0].op.Unlock()
		time.Sleep(time.Millisecond)
	}
	if err := gs[0].AllReduce(context.Background(), make([]float32, 3), Sum); !errors.Is(err, ErrBusy) {
		t.Errorf("concurrent AllReduce: %v, want ErrBusy", err)
	}
	if err := gs[1].Barrier(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// joinPair joins rank 0 with cfg0 and rank 1 with cfg1 (on the same two
// addresses) and returns both errors.
func joinPair(t *testing.T, mod0, mod1 func(*Config)) (err0, err1 error) {
	t.Helper()
	lns, addrs := listeners(t, 2)
	cfgs := make([]Config, 2)
	for r, mod := range []func(*Config){mod0, mod1} {
		cfgs[r] = Config{Rank: r, Addrs: addrs, Job: "j", Generation: 5, Listener: lns[r], JoinTimeout: time.Second, Timeout: time.Second}
		if mod != nil {
			mod(&cfgs[r])
		}
	}
	gs, errs := joinEach(cfgs, Join)
	closeAll(gs)
	return errs[0], errs[1]
}

func TestJoinRefused(t *testing.T) {
	cases := []struct {
		name string
		mod1 func(*Config)
		want string
	}{
		{"size", func(c *Config) { c.Addrs = append(c.Addrs, "127.0.0.1:1") }, "group size 3"},
		{"stale generation", func(c *Config) { c.Generation = 4 }, "generation 4 is stale"},
		{"job", func(c *Config) { c.Job = "other" }, `job "other"`},
		{"chunk", func(c *Config) { c.ChunkBytes = 8 << 10 }, "ChunkBytes"},
		{"algorithm", func(c *Config) { c.Algorithm = Ring }, "Algorithm ring"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			start := time.Now()
			err0, err1 := joinPair(t, nil, tc.mod1)
			// Rank 1 dials rank 0 and is refused at once; rank 0 waits for
			// its JoinTimeout and reports the refusal it saw.
			if !errors.Is(err1, ErrRefused) || !strings.Contains(err1.Error(), tc.want) {
				t.Errorf("rank 1: %v, want ErrRefused mentioning %q", err1, tc.want)
			}
			if !errors.Is(err0, ErrJoinTimeout) || !strings.Contains(err0.Error(), tc.want) {
				t.Errorf("rank 0: %v, want ErrJoinTimeout mentioning %q", err0, tc.want)
			}
			t.Logf("rank 0: %v\nrank 1: %v (%s)", err0, err1, time.Since(start).Round(time.Millisecond))
		})
	}
}

// TestJoinNewerWaitsForStale: a rank of generation 6 dialing a peer still in
// generation 5 keeps retrying (the peer may be about to rejoin) until its
// JoinTimeout, and then says why.
func TestJoinNewerWaitsForStale(t *testing.T) {
	err0, err1 := joinPair(t, nil, func(c *Config) { c.Generation = 6 })
	if !errors.Is(err1, ErrJoinTimeout) || !strings.Contains(err1.Error(), "generation 6 is newer") {
		t.Errorf("rank 1: %v", err1)
	}
	if !errors.Is(err0, ErrJoinTimeout) {
		t.Errorf("rank 0: %v", err0)
	}
}

// TestRejoinAfterFailure: after a rank dies, the survivors close the broken
// group and form a new one (next generation) on fresh ports.
func TestRejoinAfterFailure(t *testing.T) {
	gs := makeGroup(t, 3, func(c *Config) { c.Timeout = time.Second })
	gs[2].Close()
	onAll(gs[:2], func(r int, g *Group) error { return g.Barrier(context.Background()) })
	for _, g := range gs[:2] {
		if g.Err() == nil {
			t.Fatal("group not broken")
		}
		g.Close()
	}
	ng := makeGroup(t, 2, func(c *Config) { c.Generation = 2 })
	runAllReduce(t, ng, 1000, Mean)
}

func TestConfigErrors(t *testing.T) {
	cases := []struct {
		cfg  Config
		want string
	}{
		{Config{}, "Addrs is empty"},
		{Config{Rank: 2, Addrs: []string{"a", "b"}}, "Rank (2)"},
		{Config{Addrs: []string{"a", "b"}, ChunkBytes: 100}, "ChunkBytes (100)"},
		{Config{Addrs: []string{"a", ""}}, "Addrs[1] is empty"},
		{Config{Addrs: []string{"a"}, Timeout: -1}, "Timeout (-1ns)"},
	}
	for _, tc := range cases {
		_, err := Join(context.Background(), tc.cfg)
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want ErrConfig mentioning %q", tc.cfg, err, tc.want)
		}
	}
}

// TestStrayConnection: garbage on the listening port is refused and does not
// stop the group from forming.
func TestStrayConnection(t *testing.T) {
	lns, addrs := listeners(t, 2)
	c, err := net.Dial("tcp", addrs[0])
	if err != nil {
		t.Fatal(err)
	}
	c.Write([]byte("GET / HTTP/1.0\r\n\r\n...................................."))
	defer c.Close()
	noErrors(t, eachRank(2, func(r int) error {
		g, err := Join(context.Background(), Config{Rank: r, Addrs: addrs, Listener: lns[r], JoinTimeout: 5 * time.Second})
		if err != nil {
			return err
		}
		defer g.Close()
		return g.Barrier(context.Background())
	}))
}
