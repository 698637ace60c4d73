package test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/raftps/raftps/shard/client"
	"github.com/raftps/raftps/shard/shardpb"
)

// BenchmarkConsistencyLevels measures, on a 5-node in-process cluster with a
// 16-shard, 3-replica table of 1M rows (dim 16), a pull-heavy workload (90%
// pulls, 10% pushes, 16 Zipf-distributed keys each) at Zipf 1.1 and 1.3,
// with the table altered in turn to linearizable, bounded:100ms and
// eventual, the last two with hot-key read replicas off and on. Per run:
// pulled rows a second, pull p50/p99, and the busiest node's share of the
// rows served, as a multiple of an even share (1.0 is perfectly even).
// Every run is in the same process, one after the other, so the ratios
// between them are what to read.
//
// make bench-consistency runs it once (-benchtime 1x); RAFTPS_BENCH_ONLY
// (e.g. "1.3/10/bounded:100ms": Zipf, one push in N, level) runs one
// configuration, for profiling; RAFTPS_BENCH_WORKERS sets the number of
// closed-loop workers (default 16); RAFTPS_BENCH_REPLICATION=chain makes
// the table a chain table.
func BenchmarkConsistencyLevels(b *testing.B) {
	const (
		rows    = 1 << 20
		dim     = 16
		batch   = 16
		nodes   = 5
		warm    = 3 * time.Second
		measure = 5 * time.Second
	)
	workers := 16
	if w, err := strconv.Atoi(os.Getenv("RAFTPS_BENCH_WORKERS")); err == nil && w > 0 {
		workers = w
	}
	for range b.N {
		c := StartCluster(b, nodes, FastRaft())
		ctx := context.Background()
		admin := c.Client()
		createLoaded(b, c, admin, client.TableSpec{Name: "zipf", Dim: dim, Shards: 16, Replicas: 3, Optimizer: "sgd:lr=0.01",
			Replication: client.Replication(os.Getenv("RAFTPS_BENCH_REPLICATION"))}, rows)

		type config struct {
			name  string
			level client.Level
			bound time.Duration
			hot   float64
		}
		configs := []config{
			{"linearizable", client.Linearizable, 0, 0},
			{"bounded:100ms", client.Bounded, 100 * time.Millisecond, 0},
			{"bounded:100ms +hot", client.Bounded, 100 * time.Millisecond, 50},
			{"eventual", client.Eventual, 0, 0},
			{"eventual +hot", client.Eventual, 0, 50},
		}
		var report strings.Builder
		fmt.Fprintf(&report, "%-6s %-6s %-20s %12s %9s %9s %10s %10s %8s\n", "zipf", "pulls", "level", "pull rows/s", "p50", "p99", "busiest", "hot keys", "vs lin")
		type pass struct {
			s        float64
			pushEach int // one op in pushEach is a push; 0: pulls only
		}
		for _, ps := range []pass{{1.1, 10}, {1.3, 10}, {1.1, 0}} {
			s := ps.s
			var linRate float64
			for _, cf := range configs {
				if only := os.Getenv("RAFTPS_BENCH_ONLY"); only != "" && only != fmt.Sprintf("%.1f/%d/%s", s, ps.pushEach, cf.name) {
					continue
				}
				if _, err := admin.Tables().Alter(ctx, "zipf", client.SetConsistency(client.Consistency{Level: cf.level, Bound: cf.bound}),
					client.SetHotKeys(cf.hot, 0)); err != nil {
					b.Fatal(err)
				}
				// Fresh clients: they learn the altered spec.
				clients := make([]*client.Client, 4)
				for i := range clients {
					clients[i] = c.Client()
				}
				res := runZipf(b, c, clients, "zipf", s, ps.pushEach, rows, batch, dim, workers, warm, measure)
				hot := 0
				for i := range c.Len() {
					for _, hs := range c.Node(i).HotShards("zipf") {
						hot += len(hs.Keys)
					}
				}
				if cf.level == client.Linearizable {
					linRate = res.rate
				}
				mix := "90%"
				if ps.pushEach == 0 {
					mix = "100%"
				}
				fmt.Fprintf(&report, "%-6.1f %-6s %-20s %12.0f %9s %9s %9.2fx %10d %7.2fx\n", s, mix, cf.name, res.rate,
					res.p50.Round(10*time.Microsecond), res.p99.Round(10*time.Microsecond), res.busiest, hot, res.rate/linRate)
			}
		}
		// Printed, not logged: the testing package cuts a benchmark's log.
		fmt.Print(report.String())
	}
}

// createLoaded creates a table on a cluster of at least its replica count,
// waits until every shard has its replicas, and pushes rows distinct keys
// (0..rows-1), so every pull of them reads stored rows.
func createLoaded(b *testing.B, c *Cluster, cl *client.Client, spec client.TableSpec, rows int) {
	if _, err := cl.Tables().Create(context.Background(), spec); err != nil {
		b.Fatal(err)
	}
	if spec.Replication == client.Chain {
		for s := range uint32(spec.Shards) {
			c.waitChain(spec.Name, s, 30*time.Second, "all members", func(sm *shardpb.ShardMap) bool { return len(sm.Replicas) == spec.Replicas })
		}
	} else {
		c.waitSettled(b, spec.Name, spec.Replicas, nil, 30*time.Second)
	}
	table, dim := spec.Name, spec.Dim
	start := time.Now()
	const batch = 8192
	keys := make([]uint64, batch)
	grads := make([]float32, batch*dim)
	for i := range grads {
		grads[i] = 1
	}
	for k := 0; k < rows; k += batch {
		for i := range keys {
			keys[i] = uint64(k + i)
		}
		if err := cl.Push(context.Background(), table, keys, grads); err != nil {
			b.Fatal(err)
		}
	}
	b.Logf("loaded %d rows of dim %d in %s", rows, dim, time.Since(start).Round(time.Millisecond))
}

type zipfResult struct {
	rate     float64 // pulled rows a second
	p50, p99 time.Duration
	busiest  float64 // the busiest node's rows served over the mean
}

// runZipf runs the pull/push workload (one op in pushEach a push; 0: pulls
// only) for warm, then measures it for measure.
func runZipf(b *testing.B, c *Cluster, clients []*client.Client, table string, s float64, pushEach, rows, batch, dim, workers int, warm, measure time.Duration) zipfResult {
	var measuring atomic.Bool
	var pulled atomic.Int64
	stop := make(chan struct{})
	lat := make([][]time.Duration, workers)
	var wg sync.WaitGroup
	for w := range workers {
		cl := clients[w%len(clients)]
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), uint64(s*10)))
			z := rand.NewZipf(rng, s, 1, uint64(rows-1))
			keys := make([]uint64, batch)
			vals := make([]float32, batch*dim)
			for {
				select {
				case <-stop:
					return
				default:
				}
				for i := range keys {
					keys[i] = z.Uint64()
				}
				if pushEach > 0 && rng.IntN(pushEach) == 0 {
					for i := range vals {
						vals[i] = 0.001
					}
					if err := cl.Push(context.Background(), table, keys, vals); err != nil {
						b.Error(err)
						return
					}
					continue
				}
				t0 := time.Now()
				if err := cl.Pull(context.Background(), table, keys, vals); err != nil {
					b.Error(err)
					return
				}
				if measuring.Load() {
					lat[w] = append(lat[w], time.Since(t0))
					pulled.Add(int64(batch))
				}
			}
		})
	}
	time.Sleep(warm)
	before := servedRows(c)
	measuring.Store(true)
	start := time.Now()
	time.Sleep(measure)
	measuring.Store(false)
	elapsed := time.Since(start)
	after := servedRows(c)
	close(stop)
	wg.Wait()
	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	slices.Sort(all)
	res := zipfResult{rate: float64(pulled.Load()) / elapsed.Seconds()}
	if len(all) > 0 {
		res.p50, res.p99 = all[len(all)/2], all[len(all)*99/100]
	}
	var total, most uint64
	for i := range after {
		d := after[i] - before[i]
		total += d
		most = max(most, d)
	}
	if total > 0 {
		res.busiest = float64(most) / (float64(total) / float64(len(after)))
	}
	return res
}

// servedRows returns each node's pulled rows served so far, all roles and
// levels.
func servedRows(c *Cluster) []uint64 {
	out := make([]uint64, c.Len())
	for i := range out {
		if n := c.Node(i); n != nil {
			for _, s := range n.Served() {
				out[i] += s.Rows
			}
		}
	}
	return out
}
