package demo

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/raftps/raftps/shard/api"
	"github.com/raftps/raftps/shard/client"
	"github.com/raftps/raftps/test/localcluster"
	"github.com/raftps/raftps/trainer"
)

// Config is one demo run.
type Config struct {
	// Dir holds the cluster (default: a temporary directory, removed at
	// the end unless Keep).
	Dir string
	// BasePort is the first node's client port.
	BasePort int
	// Steps per trainer (a leader is killed half-way), Trainers
	// synchronous trainers.
	Steps, Trainers int
	// Keep leaves the cluster running at the end.
	Keep bool
}

// Run runs the demo, printing what it does and shows on out. It fails if
// an acknowledged push was lost or applied twice.
func Run(cfg Config, out io.Writer) (err error) {
	dir, base, steps, trainers, keep := cfg.Dir, cfg.BasePort, cfg.Steps, cfg.Trainers, cfg.Keep
	if steps < 1 || trainers < 1 {
		return fmt.Errorf("demo: Steps and Trainers must be at least 1")
	}
	say := func(format string, a ...any) { fmt.Fprintf(out, "==> "+format+"\n", a...) }
	if dir == "" {
		if dir, err = os.MkdirTemp("", "raftps-demo-"); err != nil {
			return err
		}
		if !keep {
			defer os.RemoveAll(dir)
		}
	}
	say("starting a 3-node cluster in %s", dir)
	c, err := localcluster.Up(localcluster.UpConfig{Dir: filepath.Join(dir, "cluster"), Nodes: 3, BasePort: base, Progress: out})
	if err != nil {
		return fmt.Errorf("cluster up: %w", err)
	}
	addrs := c.Addrs()
	fmt.Fprintf(out, "cluster of %d nodes serving at %s\n", len(c.Nodes), strings.Join(addrs, ","))
	if !keep {
		defer func() {
			say("taking the cluster down")
			c.StopAll(out)
		}()
	}
	ccfg, err := c.ClientConfig()
	if err != nil {
		return err
	}
	cl, err := client.New(ccfg)
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx := context.Background()

	// A counter table: every push adds exactly 1 to a key, so after the run
	// each row must equal the number of acknowledged pushes to it.
	const counters = 64
	if _, err := cl.Tables().Create(ctx, client.TableSpec{Name: "demo_counts", Dim: 1, Shards: 4, Optimizer: "sgd:lr=1", Initializer: "zeros"}); err != nil {
		return err
	}
	// The victim is whoever leads shard 0 half-way through: leadership moves
	// after creation (each shard's leader hands over to the placement's
	// preferred leader), so it is looked up at the moment of the kill.
	var victim string
	say("table demo_counts: the node leading its shard 0 half-way through training will be killed")

	var acked [counters]atomic.Int64
	var failed atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			k := uint64(i % counters)
			if err := cl.Push(ctx, "demo_counts", []uint64{k}, []float32{-1}); err != nil {
				failed.Add(1)
				continue
			}
			acked[k].Add(1)
		}
	})
	// A probe of shard 0 alone, to time the failover.
	probeKey := uint64(0) // a counter key of shard 0
	for api.ShardOf(probeKey, 4) != 0 && probeKey < counters-1 {
		probeKey++
	}
	var killedAt atomic.Int64
	var recovered atomic.Int64
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			if killedAt.Load() == 0 || recovered.Load() != 0 {
				continue
			}
			if err := cl.Push(ctx, "demo_counts", []uint64{probeKey}, []float32{-1}); err == nil {
				acked[probeKey].Add(1)
				recovered.Store(time.Now().UnixNano())
			} else {
				failed.Add(1)
			}
		}
	})

	say("training the DLRM-like model with %d trainers on synthetic CTR data (table train_dlrm) while pushes count on demo_counts", trainers)
	// Trainer 0 records the AUC curve and asks for the kill half-way.
	type point struct {
		step int
		wall time.Duration
		eval trainer.Eval
	}
	var curve []point
	killNow := make(chan struct{})
	killStep := max(1, steps/2)
	trainStart := time.Now()
	afterStep := func(step int, e *trainer.Eval) {
		if step == killStep {
			close(killNow)
		}
		if e != nil {
			curve = append(curve, point{step, time.Since(trainStart), *e})
		}
	}
	var killed atomic.Bool
	wg.Go(func() {
		select {
		case <-stop:
			return
		case <-killNow:
		}
		d, err := cl.Tables().Describe(ctx, "demo_counts")
		if err != nil || d.Shards[0].LeaderID == "" {
			fmt.Fprintf(out, "finding the leader of demo_counts/0: %v\n", err)
			return
		}
		victim = d.Shards[0].LeaderID
		killedAt.Store(time.Now().UnixNano())
		if err := c.Kill(victim); err != nil {
			fmt.Fprintf(out, "killing %s: %v\n", victim, err)
			return
		}
		killed.Store(true)
		say("killed %s (SIGKILL), the leader of demo_counts/0; training goes on", victim)
	})
	res, err := trainer.RunLocal(ctx, ccfg, trainers, trainer.JobConfig{Job: "demo", Table: "train_dlrm", Model: "dlrm", Dim: 8, Hidden: []int{32, 16},
		Shards: 4, Steps: steps, Batch: 64, Data: "synthetic", Fields: 8, Vocab: 100, Seed: 1, Mode: "sync",
		SlowRank: -1, CheckpointEvery: 100, EvalEvery: max(1, steps/12), EvalSamples: 20000, World: trainers, AfterStep: afterStep}, out)
	close(stop)
	wg.Wait()
	if err != nil {
		return err
	}
	if killed.Load() {
		say("restarting %s; it catches up from its data directory", victim)
		if err := c.Restart(victim, 30*time.Second, out); err != nil {
			return err
		}
	} else {
		say("training ended before the kill; run the demo with more --steps to see a failover under load")
	}
	keys := make([]uint64, counters)
	for i := range keys {
		keys[i] = uint64(i)
	}
	got := make([]float32, counters)
	if err := cl.Pull(ctx, "demo_counts", keys, got, client.WithConsistency(client.Linearizable)); err != nil {
		return err
	}
	var total, lost, doubled int64
	for i := range keys {
		want := acked[i].Load()
		total += want
		switch have := int64(got[i]); {
		case have < want:
			lost += want - have
		case have > want:
			doubled += have - want
		}
	}
	say("held-out AUC of the DLRM-like model against the Bayes-optimal AUC of the planted model")
	fmt.Fprintf(out, "  %6s %8s %8s %8s\n", "step", "time", "AUC", "Bayes")
	for i, p := range curve {
		fmt.Fprintf(out, "  %6d %7.1fs %8.4f %8.4f  %s\n", p.step, p.wall.Seconds(), p.eval.AUC, float64(p.eval.BayesAUC), strings.Repeat("#", max(0, int((p.eval.AUC-0.5)*100))))
		if killed.Load() && p.step <= killStep && (i == len(curve)-1 || curve[i+1].step > killStep) {
			fmt.Fprintf(out, "  %6d %7.1fs   <- %s killed (SIGKILL): leader of demo_counts/0\n", killStep, time.Duration(killedAt.Load()-trainStart.UnixNano()).Seconds(), victim)
		}
	}
	say("summary")
	last := res.Evals[len(res.Evals)-1]
	fmt.Fprintf(out, "  training:   %d trainers × %d steps, %d samples in %.1fs (%.0f samples/s); held-out AUC %.4f, logloss %.4f (Bayes-optimal %.4f / %.4f)\n",
		trainers, res.Steps, trainers*res.Samples, res.Seconds, float64(trainers)*res.SamplesPerS, last.AUC, last.LogLoss, last.BayesAUC, last.BayesLogLoss)
	if k, r := killedAt.Load(), recovered.Load(); k != 0 && r != 0 {
		fmt.Fprintf(out, "  failover:   first successful push to demo_counts/0 %.0f ms after killing %s\n", float64(r-k)/1e6, victim)
	}
	fmt.Fprintf(out, "  counters:   %d acknowledged pushes, %d lost, %d applied twice, %d gave up (unacknowledged)\n", total, lost, doubled, failed.Load())
	if lost != 0 || doubled != 0 {
		return fmt.Errorf("%d acknowledged pushes lost, %d applied twice", lost, doubled)
	}
	if keep {
		say("cluster left running: . %s; raftps status; raftps cluster down --dir %s", filepath.Join(dir, "cluster", "env"), filepath.Join(dir, "cluster"))
	}
	return nil
}
