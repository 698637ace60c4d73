package test

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/raftps/raftps/shard"
	"github.com/raftps/raftps/shard/client"
	"github.com/raftps/raftps/shard/membership"
)

// BenchmarkElasticRepair measures, on a 5-node in-process cluster with a
// 16-shard, 3-replica table of 1M rows (dim 16):
//
//   - repair: the time from a node's death to every shard having 3 live
//     replicas again, split into gossip detection, the repair grace period,
//     and the copying (snapshot transfer and membership changes);
//   - rebalance: the push throughput of 4 clients (2048 random keys per
//     push) while a sixth node joins
//     and receives its share, as a ratio to the throughput just before, in
//     the same run.
//
// make bench-elastic runs it once (-benchtime 1x).
func BenchmarkElasticRepair(b *testing.B) {
	const (
		rows  = 1 << 20
		dim   = 16
		grace = 2 * time.Second
	)
	for range b.N {
		c := StartClusterWith(b, 5, FastRaft(), func(cfg *shard.NodeConfig) {
			cfg.RepairGrace = grace
		})
		cl := c.Client()
		ctx := context.Background()
		createLoaded(b, c, cl, client.TableSpec{Name: "big", Dim: dim, Shards: 16, Replicas: 3, Optimizer: "sgd:lr=1"}, rows)

		// Repair: kill the node holding the most replicas.
		reps, _ := c.loads("big")
		victim := 0
		for i := range c.Len() {
			if reps[c.ID(i)] > reps[c.ID(victim)] {
				victim = i
			}
		}
		watcher := c.Node((victim + 1) % c.Len())
		killed := time.Now()
		c.Kill(victim)
		var detected time.Duration
		for detected == 0 {
			for _, m := range watcher.Members() {
				if m.ID == c.ID(victim) && m.State == membership.Dead {
					detected = time.Since(killed)
				}
			}
			time.Sleep(10 * time.Millisecond)
		}
		total := c.waitSettled(b, "big", 3, []string{c.ID(victim)}, 10*time.Minute) + detected
		copying := total - detected - grace
		b.Logf("repair of %s (%d of 48 replicas, ~%d rows): detected dead after %s, grace %s, copying %s; total %s",
			c.ID(victim), reps[c.ID(victim)], rows*reps[c.ID(victim)]/16, detected.Round(time.Millisecond), grace,
			copying.Round(time.Millisecond), total.Round(time.Millisecond))
		b.ReportMetric(total.Seconds(), "repair_s")
		b.ReportMetric(copying.Seconds(), "repair_copy_s")
		b.ReportMetric(float64(rows*reps[c.ID(victim)]/16)/copying.Seconds(), "rows_copied/s")

		// Rebalance: push throughput before and while a node joins.
		var pushes atomic.Int64
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for w := range 4 {
			cl := c.Client()
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(w), 1))
				keys := make([]uint64, 2048)
				grads := make([]float32, 2048*dim)
				for {
					select {
					case <-stop:
						return
					default:
					}
					for i := range keys {
						keys[i] = rng.Uint64N(rows)
					}
					if err := cl.Push(ctx, "big", keys, grads); err != nil {
						b.Error(err)
						return
					}
					pushes.Add(1)
				}
			})
		}
		rate := func(d time.Duration) float64 {
			before, t0 := pushes.Load(), time.Now()
			time.Sleep(d)
			return float64(pushes.Load()-before) / time.Since(t0).Seconds()
		}
		rate(2 * time.Second) // warm up
		base := rate(10 * time.Second)
		joinedAt := time.Now()
		joined := c.AddNode()
		before := pushes.Load()
		var live []string
		for i := range c.Len() {
			if i != victim {
				live = append(live, c.ID(i))
			}
		}
		c.waitBalanced(b, "big", live, 10*time.Minute)
		rebalance := time.Since(joinedAt)
		during := float64(pushes.Load()-before) / rebalance.Seconds()
		close(stop)
		wg.Wait()
		r, l := c.loads("big")
		b.Logf("rebalance onto %s took %s (%d replicas, %d leaders moved to it); pushes/s: %.0f before, %.0f during = %.2f",
			c.ID(joined), rebalance.Round(time.Millisecond), r[c.ID(joined)], l[c.ID(joined)], base, during, during/base)
		b.ReportMetric(rebalance.Seconds(), "rebalance_s")
		b.ReportMetric(during/base, "push_ratio_during_rebalance")
	}
}
