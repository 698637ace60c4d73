package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"runtime/pprof"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/raftps/raftps/shard"
	"github.com/raftps/raftps/shard/shardpb"
)

type benchConfig struct {
	workload  string // pull, push or mixed
	keys      int
	dim       int
	batch     int
	zipf      float64
	clients   int
	duration  time.Duration
	table     string
	shards    int
	optimizer string
	// replication of the table bench creates: raft or chain.
	replication string
	load        bool
}

type benchResult struct {
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
}

func runBench(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("raftps bench", flag.ContinueOnError)
	var cf clusterFlags
	cf.register(fs)
	var bc benchConfig
	fs.StringVar(&bc.workload, "workload", "mixed", "pull, push or mixed (half each)")
	fs.IntVar(&bc.keys, "keys", 1000000, "distinct keys in the table")
	fs.IntVar(&bc.dim, "dim", 64, "row length (when bench creates the table)")
	fs.IntVar(&bc.batch, "batch", 4096, "distinct keys per pull or push")
	fs.Float64Var(&bc.zipf, "zipf", 1.1, "Zipf exponent of key popularity (> 1)")
	fs.IntVar(&bc.clients, "clients", 4, "concurrent clients")
	fs.DurationVar(&bc.duration, "duration", 20*time.Second, "how long to run")
	fs.StringVar(&bc.table, "table", "", "use this existing table instead of creating one")
	fs.IntVar(&bc.shards, "shards", 16, "shards (when bench creates the table)")
	fs.StringVar(&bc.optimizer, "optimizer", "sgd", "optimizer (when bench creates the table)")
	fs.StringVar(&bc.replication, "replication", shard.ReplicationRaft, "raft or chain (when bench creates the table)")
	fs.BoolVar(&bc.load, "load", true, "push every key once before measuring")
	cpuProfile := fs.String("cpuprofile", "", "write the bench client's CPU profile to this file")
	if rc := parse(fs, args, stderr); rc >= 0 {
		return rc
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return fail(stderr, "bench", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fail(stderr, "bench", err)
		}
		defer pprof.StopCPUProfile()
	}
	if bc.workload != "pull" && bc.workload != "push" && bc.workload != "mixed" {
		return fail(stderr, "bench", fmt.Errorf("--workload %q: want pull, push or mixed", bc.workload))
	}
	if bc.zipf <= 1 || bc.keys < bc.batch || bc.batch < 1 || bc.clients < 1 {
		return fail(stderr, "bench", fmt.Errorf("need --zipf > 1, --batch >= 1, --keys >= --batch, --clients >= 1"))
	}
	if len(cf.addrs()) == 0 {
		return fail(stderr, "bench", fmt.Errorf("no cluster given: pass --cluster or set RAFTPS_CLUSTER"))
	}
	res, err := benchmark(context.Background(), cf.addrs(), bc, stderr)
	if err != nil {
		return fail(stderr, "bench", err)
	}
	if cf.json {
		_ = printJSON(stdout, res)
		return 0
	}
	fmt.Fprintf(stdout, "%s on %s: %.0f rows/s (push %.0f, pull %.0f), batch latency p50 %.1f ms p99 %.1f ms max %.1f ms, %d errors, %d clients × %d keys, %.1fs\n",
		res.Workload, res.Table, res.RowsPerS, res.PushRowsPerS, res.PullRowsPerS, res.P50ms, res.P99ms, res.MaxMs, res.Errors, res.Clients, res.Batch, res.Seconds)
	return 0
}

// benchmark runs the workload and reports progress on progress once a
// second.
func benchmark(ctx context.Context, addrs []string, bc benchConfig, progress io.Writer) (*benchResult, error) {
	admin, err := shard.NewClient(shard.ClientConfig{Addrs: addrs})
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	if bc.table == "" {
		bc.table = fmt.Sprintf("bench_%d", time.Now().Unix())
		spec, err := admin.CreateTable(ctx, &shardpb.TableSpec{Name: bc.table, Dim: uint32(bc.dim), Shards: uint32(bc.shards),
			Optimizer: bc.optimizer, Initializer: "uniform:0.01", Replication: bc.replication})
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(progress, "created table %s (dim %d, %d shards, %s, %s replication)\n", spec.Name, spec.Dim, spec.Shards, spec.Optimizer, spec.Replication)
	} else {
		d, err := admin.Describe(ctx, bc.table)
		if err != nil {
			return nil, err
		}
		bc.dim = int(d.Spec.Dim)
	}
	clients := make([]*shard.Client, bc.clients)
	for i := range clients {
		if clients[i], err = shard.NewClient(shard.ClientConfig{Addrs: addrs}); err != nil {
			return nil, err
		}
		defer clients[i].Close()
	}
	if bc.load {
		if err := loadKeys(ctx, clients, bc, progress); err != nil {
			return nil, err
		}
	}

	// Batches are drawn before the clock starts: the load generator shares
	// the machine's cores with the servers, and drawing 4096 distinct Zipf
	// keys costs more than the pull it feeds.
	batches := make([]clientBatches, bc.clients)
	for w := range batches {
		batches[w] = drawBatches(bc, uint64(w))
	}
	var rows, pushRows, pullRows, errs atomic.Int64
	lats := make([][]time.Duration, bc.clients)
	start := time.Now()
	deadline := start.Add(bc.duration)
	var wg sync.WaitGroup
	for w := range bc.clients {
		wg.Go(func() {
			bs := batches[w]
			out := make([]float32, bc.batch*bc.dim)
			for i := 0; time.Now().Before(deadline); i++ {
				keys := bs.keys[i%len(bs.keys)]
				push := bc.workload == "push" || (bc.workload == "mixed" && i%2 == 0)
				t0 := time.Now()
				var err error
				if push {
					err = clients[w].Push(ctx, bc.table, keys, bs.grads)
				} else {
					err = clients[w].Pull(ctx, bc.table, keys, out)
				}
				if err != nil {
					errs.Add(1)
					fmt.Fprintf(progress, "client %d: %v\n", w, err)
					continue
				}
				lats[w] = append(lats[w], time.Since(t0))
				rows.Add(int64(bc.batch))
				if push {
					pushRows.Add(int64(bc.batch))
				} else {
					pullRows.Add(int64(bc.batch))
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
	return &benchResult{
		Workload: bc.workload, Table: bc.table, Clients: bc.clients, Batch: bc.batch, Dim: bc.dim, Seconds: elapsed,
		RowsPerS: float64(rows.Load()) / elapsed, PushRowsPerS: float64(pushRows.Load()) / elapsed, PullRowsPerS: float64(pullRows.Load()) / elapsed,
		P50ms: q(0.5), P99ms: q(0.99), MaxMs: q(1), Errors: errs.Load(),
	}, nil
}

// benchBatchesPerClient is how many distinct key batches each client cycles
// through: enough that the hot set is not one batch's, few enough to draw
// quickly.
const benchBatchesPerClient = 64

type clientBatches struct {
	keys  [][]uint64 // each bc.batch distinct keys, Zipf-distributed
	grads []float32  // bc.batch × dim small gradients, reused by every push
}

func drawBatches(bc benchConfig, seed uint64) clientBatches {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	z := rand.NewZipf(rng, bc.zipf, 1, uint64(bc.keys-1))
	seen := make(map[uint64]bool, bc.batch)
	cb := clientBatches{grads: make([]float32, bc.batch*bc.dim)}
	for range benchBatchesPerClient {
		clear(seen)
		keys := make([]uint64, 0, bc.batch)
		// A steep Zipf repeats its head so often that a large batch of
		// distinct keys may take millions of draws: after 64 draws a key,
		// the rest of the batch is uniform, so a batch is always drawn.
		for draws := 0; len(keys) < bc.batch; draws++ {
			k := z.Uint64()
			if draws > 64*bc.batch {
				k = rng.Uint64N(uint64(bc.keys))
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
func loadKeys(ctx context.Context, clients []*shard.Client, bc benchConfig, progress io.Writer) error {
	var next, done atomic.Int64
	start := time.Now()
	errc := make(chan error, len(clients))
	var wg sync.WaitGroup
	for _, cl := range clients {
		wg.Go(func() {
			keys := make([]uint64, 0, bc.batch)
			zero := make([]float32, bc.batch*bc.dim)
			for {
				lo := next.Add(int64(bc.batch)) - int64(bc.batch)
				if lo >= int64(bc.keys) {
					return
				}
				keys = keys[:0]
				for k := lo; k < min(lo+int64(bc.batch), int64(bc.keys)); k++ {
					keys = append(keys, uint64(k))
				}
				if err := cl.Push(ctx, bc.table, keys, zero[:len(keys)*bc.dim]); err != nil {
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
				fmt.Fprintf(progress, "loading: %d of %d keys\n", done.Load(), bc.keys)
			}
		}
	}()
	wg.Wait()
	close(stop)
	close(errc)
	if err := <-errc; err != nil {
		return fmt.Errorf("loading keys: %w", err)
	}
	fmt.Fprintf(progress, "loaded %d keys in %.1fs\n", bc.keys, time.Since(start).Seconds())
	return nil
}
