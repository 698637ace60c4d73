package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"strings"

	"github.com/raftps/raftps/shard/client"
	"github.com/raftps/raftps/test/localcluster"
	"github.com/raftps/raftps/trainer"
)

// trainConfig is raftps train's flags: a trainer.JobConfig, with the
// lists as the flags spell them.
type trainConfig struct {
	trainer.JobConfig
	hidden string // dlrm hidden sizes, comma-separated
	peers  string // static collective addresses by rank
	quiet  bool
	// metricsAddr: --metrics-addr.
	metricsAddr string
}

func (tc *trainConfig) register(fs *flag.FlagSet) {
	fs.StringVar(&tc.Job, "job", "", "job name (default train_MODEL): a job restarted under its name resumes; trainers of one job must agree on it")
	fs.StringVar(&tc.Table, "table", "", "embedding table (created if missing; default the job name)")
	fs.StringVar(&tc.Model, "model", "lr", "lr (logistic regression) or dlrm (embedding bags + MLP)")
	fs.IntVar(&tc.Dim, "dim", 8, "embedding dimension (dlrm)")
	fs.StringVar(&tc.hidden, "hidden", "32,16", "hidden layer sizes (dlrm)")
	fs.StringVar(&tc.Optimizer, "optimizer", "", "optimizer of the table when train creates it (default adagrad:lr=0.2 for lr, adagrad:lr=0.1 for dlrm)")
	fs.IntVar(&tc.Shards, "shards", 8, "shards of the embedding table when train creates it")
	fs.Func("grad-precision", "gradient precision of the embedding table when train creates it: fp32 (default) or bf16", func(v string) error {
		if v != string(client.GradFP32) && v != string(client.GradBF16) {
			return fmt.Errorf("want %s or %s", client.GradFP32, client.GradBF16)
		}
		tc.GradPrecision = client.GradPrecision(v)
		return nil
	})
	fs.IntVar(&tc.Steps, "steps", 2000, "training steps per trainer (a resumed job goes on to this step)")
	fs.IntVar(&tc.Batch, "batch", 64, "samples per step and trainer")
	fs.Float64Var(&tc.DenseLR, "dense-lr", 0, "SGD step of the dense parameters (default 0.5 for lr, 0.1 for dlrm)")
	fs.StringVar(&tc.Data, "data", "synthetic", "synthetic, criteo:PATH (Criteo TSV) or libsvm:PATH")
	fs.Float64Var(&tc.HoldOut, "holdout", 0.1, "criteo and libsvm: the fraction of the file, from its end, held out for evaluation")
	fs.IntVar(&tc.Examples, "examples", 0, "synthetic data: training examples (read in epochs); 0 for an endless stream")
	fs.IntVar(&tc.Fields, "fields", 8, "synthetic data: categorical fields")
	fs.IntVar(&tc.Vocab, "vocab", 100, "synthetic data: ids per field (larger needs more steps to approach the Bayes AUC)")
	fs.Uint64Var(&tc.Seed, "seed", 1, "synthetic data and dense initialisation seed (the same on every trainer)")
	fs.StringVar(&tc.Mode, "mode", "sync", "sync, async or ssp:S (a trainer runs at most S steps ahead of the slowest)")
	fs.IntVar(&tc.BackupWorkers, "backup-workers", 0, "sync: each step goes on with the first N-B trainers' gradients and discards the late ones")
	fs.IntVar(&tc.SlowRank, "slow-rank", -1, "make this rank a straggler (with --slowdown)")
	fs.Float64Var(&tc.Slowdown, "slowdown", 3, "how many times slower --slow-rank runs")
	fs.IntVar(&tc.CheckpointEvery, "checkpoint-every", 100, "sync: trainer 0 checkpoints the dense parameters into the job's state table every this many steps")
	fs.IntVar(&tc.EvalEvery, "eval-every", 0, "evaluate every this many steps (default steps/5)")
	fs.IntVar(&tc.EvalSamples, "eval-samples", 20000, "synthetic data: held-out samples per evaluation")
	fs.IntVar(&tc.Rank, "rank", 0, "this trainer's rank (0..world-1; -1: let the cluster's job registry assign one)")
	fs.IntVar(&tc.World, "world", 1, "trainers in the job, when they are started one by one (see --trainers)")
	fs.StringVar(&tc.peers, "peers", "", "collective addresses of every trainer, by rank (host:port,...); empty: trainers find each other through the cluster")
	fs.StringVar(&tc.Listen, "listen", "127.0.0.1:0", "collective listen address this trainer registers with the cluster (must be reachable by the other trainers)")
	fs.BoolVar(&tc.quiet, "quiet", false, "no progress output")
	fs.StringVar(&tc.metricsAddr, "metrics-addr", "", "serve Prometheus metrics (steps, examples, latencies, eval AUC) at http://ADDR/metrics; with --trainers, trainer k serves at the port + k")
}

func runTrain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("raftps train", flag.ContinueOnError)
	var cf clusterFlags
	cf.register(fs)
	var tc trainConfig
	tc.register(fs)
	trainers := fs.Int("trainers", 1, "run this many trainer processes of the job on this machine (rank 0 is this one)")
	if rc := parse(fs, args, stderr); rc >= 0 {
		return rc
	}
	if *trainers < 1 || (*trainers > 1 && (tc.peers != "" || tc.World != 1)) {
		return fail(stderr, "train", fmt.Errorf("--trainers %d: want at least 1, and not together with --peers or --world", *trainers))
	}
	if err := tc.lists(); err != nil {
		return fail(stderr, "train", err)
	}
	if len(tc.Peers) > 0 {
		tc.World = len(tc.Peers)
	}
	tc.Job = cmp.Or(tc.Job, "train_"+tc.Model)
	var children *localcluster.Children
	if *trainers > 1 {
		tc.World, tc.Rank = *trainers, 0
	}
	if _, err := tc.Check(); err != nil {
		return fail(stderr, "train", err)
	}
	if *trainers > 1 {
		var err error
		if children, err = startTrainers(args, *trainers, tc.metricsAddr, stderr); err != nil {
			return fail(stderr, "train", err)
		}
	}
	progress := io.Writer(stderr)
	if tc.quiet {
		progress = io.Discard
	}
	if tc.metricsAddr != "" {
		reg, stop, err := trainer.ServeMetrics(tc.metricsAddr, progress)
		if err != nil {
			return fail(stderr, "train", fmt.Errorf("--metrics-addr: %w", err))
		}
		defer stop()
		tc.Metrics, cf.metrics = reg, reg
	}
	cl, err := cf.client()
	if err != nil {
		return fail(stderr, "train", err)
	}
	defer cl.Close()
	res, err := trainer.RunJob(context.Background(), cl, tc.JobConfig, progress)
	var others []trainer.Summary
	if children != nil {
		var werr error
		others, werr = trainerSummaries(children)
		err = errors.Join(err, werr)
	}
	if err != nil {
		return fail(stderr, "train", err)
	}
	out := trainer.Summarize(tc.JobConfig, res, others)
	if cf.json {
		_ = printJSON(stdout, out)
		return 0
	}
	if len(res.Evals) == 0 {
		fmt.Fprintf(stdout, "trainer %d of job %s: %d steps (%s), %d samples in %.1fs (%.0f samples/s)\n", res.Rank, tc.Job, res.Steps, res.Mode, res.Samples, res.Seconds, res.SamplesPerS)
		return 0
	}
	fmt.Fprintf(stdout, "trained %s (job %s, %s, %d trainers): steps %d-%d, %.0f samples/s in all, %.1fs; held-out AUC %.4f, logloss %.4f (Bayes-optimal %s / %s); pull p50 %.1f ms, push p50 %.1f ms\n",
		tc.Model, tc.Job, res.Mode, res.World, res.FirstStep, res.Steps, out.ExamplesPerS, res.Seconds,
		out.FinalAUC, out.FinalLogLoss, optional(out.BayesAUC), optional(out.BayesLogLoss), res.Pull.P50, res.Push.P50)
	return 0
}

// lists parses the flags that are lists.
func (tc *trainConfig) lists() error {
	tc.Hidden = nil
	for _, h := range strings.Split(tc.hidden, ",") {
		var n int
		if _, err := fmt.Sscan(strings.TrimSpace(h), &n); err != nil || n < 1 {
			return fmt.Errorf("--hidden %q: want positive sizes separated by commas", tc.hidden)
		}
		tc.Hidden = append(tc.Hidden, n)
	}
	tc.Peers = splitList(tc.peers)
	return nil
}

func optional(v trainer.Optional) string {
	if math.IsNaN(float64(v)) {
		return "unknown"
	}
	return fmt.Sprintf("%.4f", float64(v))
}

// startTrainers starts trainers 1..n-1 as child processes running this
// command with the same flags and --world n --rank r; they find each other
// through the cluster's job registry (or the given --peers).
func startTrainers(args []string, n int, metricsAddr string, stderr io.Writer) (*localcluster.Children, error) {
	if metricsAddr != "" {
		// Refuse a bad address before any child starts.
		if _, err := trainer.MetricsAddr(metricsAddr, n-1); err != nil {
			return nil, fmt.Errorf("--metrics-addr: %w", err)
		}
	}
	var argv [][]string
	for r := 1; r < n; r++ {
		extra := []string{"--trainers", "1", "--world", fmt.Sprint(n), "--rank", fmt.Sprint(r), "--quiet", "--json"}
		if metricsAddr != "" {
			addr, _ := trainer.MetricsAddr(metricsAddr, r)
			extra = append(extra, "--metrics-addr", addr)
		}
		argv = append(argv, append(append([]string{"train"}, args...), extra...))
	}
	return localcluster.StartChildren(argv, stderr)
}

// trainerSummaries waits for the children and returns their summaries.
func trainerSummaries(ch *localcluster.Children) ([]trainer.Summary, error) {
	outs, err := ch.Wait()
	var errs []error
	var out []trainer.Summary
	for i, b := range outs {
		var s trainer.Summary
		if b == nil {
			continue // failed: in err
		}
		if err := json.Unmarshal(b, &s); err != nil {
			errs = append(errs, fmt.Errorf("trainer %d: reading its summary: %w", i+1, err))
			continue
		}
		out = append(out, s)
	}
	return out, errors.Join(append(errs, err)...)
}
