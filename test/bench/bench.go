package bench

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/raftps/raftps/shard/client"
)

// Config is one benchmark run. Start from DefaultConfig.
type Config struct {
	// Workload: "pull", "push" or "mixed" (half each).
	Workload string
	// Keys distinct keys, Batch distinct keys per call, drawn with Zipf
	// exponent Zipf (> 1), by Clients concurrent clients, for Duration.
	Keys     int
	Batch    int
	Zipf     float64
	Clients  int
	Duration time.Duration
	// Table to use; empty: create a new one of Dim, Shards, Optimizer and
	// Replication.
	Table       string
	Dim         int
	Shards      int
	Optimizer   string
	Replication string
	// Load pushes every key once before measuring, so pulls read rows that
	// exist.
	Load bool
	// Client, if set, tunes each client's config.
	Client func(*client.Config)
}

// DefaultConfig is the configuration raftps bench starts from.
func DefaultConfig() Config {
	return Config{Workload: "mixed", Keys: 1000000, Batch: 4096, Zipf: 1.1, Clients: 4, Duration: 20 * time.Second,
		Dim: 64, Shards: 16, Optimizer: "sgd", Replication: "raft", Load: true}
}

// Validate reports what is wrong with the config, naming the fields.
func (c Config) Validate() error {
	if c.Workload != "pull" && c.Workload != "push" && c.Workload != "mixed" {
		return fmt.Errorf("bench config: Workload %q: want pull, push or mixed", c.Workload)
	}
	if c.Zipf <= 1 || c.Keys < c.Batch || c.Batch < 1 || c.Clients < 1 || c.Duration <= 0 {
		return fmt.Errorf("bench config: need Zipf > 1 (%v), Batch >= 1 (%d), Keys >= Batch (%d), Clients >= 1 (%d), Duration > 0 (%s)", c.Zipf, c.Batch, c.Keys, c.Clients, c.Duration)
	}
	return nil
}

// Result is what a run measured.
type Result struct {
	Workload     string  `json:"workload"`
	Table        string  `json:"table"`
	Clients      int     `json:"clients"`
	Batch        int     `json:"batch"`
	Dim          int     `json:"dim"`
	Seconds      float64 `json:"seconds"`
	RowsPerS     float64 `json:"rows_per_s"`
	PushRowsPerS float64 `json:"push_rows_per_s"`
	PullRowsPerS float64 `json:"pull_rows_per_s"`
	P50ms        float64 `json:"p50_ms"`
	P99ms        float64 `json:"p99_ms"`
	MaxMs        float64 `json:"max_ms"`
	Errors       int64   `json:"errors"`
	// Hedges: the hedge calls the clients sent (reads only).
	Hedges uint64 `json:"hedges"`
}

// Run runs the workload against the cluster at addrs and reports progress
// on progress once a second.
func Run(ctx context.Context, addrs []string, bc Config, progress io.Writer) (*Result, error) {
	if err := bc.Validate(); err != nil {
		return nil, err
	}
	if progress == nil {
		progress = io.Discard
	}
	newClient := func() (*client.Client, error) {
		cfg := client.DefaultConfig(addrs...)
		if bc.Client != nil {
			bc.Client(&cfg)
		}
		return client.New(cfg)
	}
	admin, err := newClient()
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	if bc.Table == "" {
		bc.Table = fmt.Sprintf("bench_%d", time.Now().Unix())
		spec, err := admin.Tables().Create(ctx, client.TableSpec{Name: bc.Table, Dim: bc.Dim, Shards: bc.Shards,
			Optimizer: bc.Optimizer, Initializer: "uniform:0.01", Replication: client.Replication(bc.Replication)})
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(progress, "created table %s (dim %d, %d shards, %s, %s replication)\n", spec.Name, spec.Dim, spec.Shards, spec.Optimizer, spec.Replication)
	} else {
		d, err := admin.Tables().Describe(ctx, bc.Table)
		if err != nil {
			return nil, err
		}
		bc.Dim = d.Spec.Dim
	}
	clients := make([]*client.Client, bc.Clients)
	for i := range clients {
		if clients[i], err = newClient(); err != nil {
			return nil, err
		}
		defer clients[i].Close()
	}
	if bc.Load {
		if err := loadKeys(ctx, clients, bc, progress); err != nil {
			return nil, err
		}
	}

	// Batches are drawn before the clock starts: the load generator shares
	// the machine's cores with the servers, and drawing 4096 distinct Zipf
	// keys costs more than the pull it feeds.
	batches := make([]clientBatches, bc.Clients)
	for w := range batches {
		batches[w] = drawBatches(bc, uint64(w))
	}
	var rows, pushRows, pullRows, errs atomic.Int64
	lats := make([][]time.Duration, bc.Clients)
	start := time.Now()
	deadline := start.Add(bc.Duration)
	var wg sync.WaitGroup
	for w := range bc.Clients {
		wg.Go(func() {
			bs := batches[w]
			out := make([]float32, bc.Batch*bc.Dim)
			for i := 0; time.Now().Before(deadline); i++ {
				keys := bs.keys[i%len(bs.keys)]
				push := bc.Workload == "push" || (bc.Workload == "mixed" && i%2 == 0)
				t0 := time.Now()
				var err error
				if push {
					err = clients[w].Push(ctx, bc.Table, keys, bs.grads)
				} else {
					err = clients[w].Pull(ctx, bc.Table, keys, out)
				}
				if err != nil {
					errs.Add(1)
					fmt.Fprintf(progress, "client %d: %v\n", w, err)
					continue
				}
				lats[w] = append(lats[w], time.Since(t0))
				rows.Add(int64(bc.Batch))
				if push {
					pushRows.Add(int64(bc.Batch))
				} else {
					pullRows.Add(int64(bc.Batch))
				}
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	last, lastT := int64(0), start
loop:
	for {
		select {
		case <-done:
			break loop
		case now := <-tick.C:
			r := rows.Load()
			fmt.Fprintf(progress, "%5.1fs  %10.0f rows/s  errors %d\n", now.Sub(start).Seconds(), float64(r-last)/now.Sub(lastT).Seconds(), errs.Load())
			last, lastT = r, now
		}
	}
	elapsed := time.Since(start).Seconds()
	all := slices.Concat(lats...)
	slices.Sort(all)
	q := func(p float64) float64 {
		if len(all) == 0 {
			return 0
		}
		return float64(all[min(len(all)-1, int(p*float64(len(all))))].Microseconds()) / 1000
	}
	return &Result{
		Workload: bc.Workload, Table: bc.Table, Clients: bc.Clients, Batch: bc.Batch, Dim: bc.Dim, Seconds: elapsed,
		RowsPerS: float64(rows.Load()) / elapsed, PushRowsPerS: float64(pushRows.Load()) / elapsed, PullRowsPerS: float64(pullRows.Load()) / elapsed,
		P50ms: q(0.5), P99ms: q(0.99), MaxMs: q(1), Errors: errs.Load(), Hedges: hedges(clients),
	}, nil
}

// batchesPerClient is how many distinct key batches each client cycles
// through: enough that the hot set is not one batch's, few enough to draw
// quickly.
const batchesPerClient = 64

type clientBatches struct {
	keys  [][]uint64 // each bc.Batch distinct keys, Zipf-distributed
	grads []float32  // bc.Batch × dim small gradients, reused by every push
}

func drawBatches(bc Config, seed uint64) clientBatches {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	z := rand.NewZipf(rng, bc.Zipf, 1, uint64(bc.Keys-1))
	seen := make(map[uint64]bool, bc.Batch)
	cb := clientBatches{grads: make([]float32, bc.Batch*bc.Dim)}
	for range batchesPerClient {
		clear(seen)
		keys := make([]uint64, 0, bc.Batch)
		// A steep Zipf repeats its head so often that a large batch of
		// distinct keys may take millions of draws: after 64 draws a key,
		// the rest of the batch is uniform, so a batch is always drawn.
		for draws := 0; len(keys) < bc.Batch; draws++ {
			k := z.Uint64()
			if draws > 64*bc.Batch {
				k = rng.Uint64N(uint64(bc.Keys))
			}
			if !seen[k] {
				seen[k] = true
				keys = append(keys, k)
			}
		}
		cb.keys = append(cb.keys, keys)
	}
	for i := range cb.grads {
		cb.grads[i] = float32(rng.NormFloat64()) * 0.01
	}
	return cb
}

// loadKeys pushes a zero gradient to every key once, so pulls read rows that
// exist, split among the clients.
func loadKeys(ctx context.Context, clients []*client.Client, bc Config, progress io.Writer) error {
	var next, done atomic.Int64
	start := time.Now()
	errc := make(chan error, len(clients))
	var wg sync.WaitGroup
	for _, cl := range clients {
		wg.Go(func() {
			keys := make([]uint64, 0, bc.Batch)
			zero := make([]float32, bc.Batch*bc.Dim)
			for {
				lo := next.Add(int64(bc.Batch)) - int64(bc.Batch)
				if lo >= int64(bc.Keys) {
					return
				}
				keys = keys[:0]
				for k := lo; k < min(lo+int64(bc.Batch), int64(bc.Keys)); k++ {
					keys = append(keys, uint64(k))
				}
				if err := cl.Push(ctx, bc.Table, keys, zero[:len(keys)*bc.Dim]); err != nil {
					errc <- err
					return
				}
				done.Add(int64(len(keys)))
			}
		})
	}
	stop := make(chan struct{})
	go func() {
		t := time.NewTicker(2 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				fmt.Fprintf(progress, "loading: %d of %d keys\n", done.Load(), bc.Keys)
			}
		}
	}()
	wg.Wait()
	close(stop)
	close(errc)
	if err := <-errc; err != nil {
		return fmt.Errorf("loading keys: %w", err)
	}
	fmt.Fprintf(progress, "loaded %d keys in %.1fs\n", bc.Keys, time.Since(start).Seconds())
	return nil
}

func hedges(clients []*client.Client) uint64 {
	var n uint64
	for _, c := range clients {
		n += c.Hedges()
	}
	return n
}
