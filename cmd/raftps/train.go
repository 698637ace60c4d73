package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"strings"

	"github.com/raftps/raftps/trainer"
)

// trainConfig is raftps train's flags: a trainer.JobConfig, with the
// lists as the flags spell them.
type trainConfig struct {
	trainer.JobConfig
	hidden string // dlrm hidden sizes, comma-separated
	peers  string // static collective addresses by rank
	quiet  bool
}

func (tc *trainConfig) register(fs *flag.FlagSet) {
	fs.StringVar(&tc.Job, "job", "", "job name (default train_MODEL): a job restarted under its name resumes; trainers of one job must agree on it")
	fs.StringVar(&tc.Table, "table", "", "embedding table (created if missing; default the job name)")
	fs.StringVar(&tc.Model, "model", "lr", "lr (logistic regression) or dlrm (embedding bags + MLP)")
	fs.IntVar(&tc.Dim, "dim", 8, "embedding dimension (dlrm)")
	fs.StringVar(&tc.hidden, "hidden", "32,16", "hidden layer sizes (dlrm)")
	fs.StringVar(&tc.Optimizer, "optimizer", "", "optimizer of the table when train creates it (default adagrad:lr=0.2 for lr, adagrad:lr=0.1 for dlrm)")
	fs.IntVar(&tc.Shards, "shards", 8, "shards of the embedding table when train creates it")
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
	var children *trainerProcs
	if *trainers > 1 {
		tc.World, tc.Rank = *trainers, 0
	}
	if _, err := tc.Check(); err != nil {
		return fail(stderr, "train", err)
	}
	if *trainers > 1 {
		var err error
		if children, err = startTrainers(args, *trainers, stderr); err != nil {
			return fail(stderr, "train", err)
		}
	}
	cl, err := cf.client()
	if err != nil {
		return fail(stderr, "train", err)
	}
	defer cl.Close()
	progress := io.Writer(stderr)
	if tc.quiet {
		progress = io.Discard
	}
	res, err := trainer.RunJob(context.Background(), cl, tc.JobConfig, progress)
	var others []trainer.Summary
	if children != nil {
		var werr error
		others, werr = children.wait()
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

// trainerProcs are the trainers 1..n-1 that raftps train --trainers n
// started.
type trainerProcs struct {
	cmds []*exec.Cmd
	outs []*bytes.Buffer
}

// startTrainers starts trainers 1..n-1 as child processes running this
// command with the same flags and --world n --rank r; they find each other
// through the cluster's job registry (or the given --peers).
func startTrainers(args []string, n int, stderr io.Writer) (*trainerProcs, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	p := &trainerProcs{}
	for r := 1; r < n; r++ {
		cmd := exec.Command(self, append(append([]string{"train"}, args...),
			"--trainers", "1", "--world", fmt.Sprint(n), "--rank", fmt.Sprint(r), "--quiet", "--json")...)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, stderr
		dieWithParent(cmd)
		if err := cmd.Start(); err != nil {
			for _, c := range p.cmds {
				_ = c.Process.Kill()
			}
			return nil, fmt.Errorf("starting trainer %d: %w", r, err)
		}
		p.cmds, p.outs = append(p.cmds, cmd), append(p.outs, &out)
	}
	return p, nil
}

// wait waits for the children and returns their summaries.
func (p *trainerProcs) wait() ([]trainer.Summary, error) {
	var errs []error
	var out []trainer.Summary
	for i, c := range p.cmds {
		if err := c.Wait(); err != nil {
			errs = append(errs, fmt.Errorf("trainer %d: %w", i+1, err))
			continue
		}
		var s trainer.Summary
		if err := json.Unmarshal(p.outs[i].Bytes(), &s); err != nil {
			errs = append(errs, fmt.Errorf("trainer %d: reading its summary: %w", i+1, err))
			continue
		}
		out = append(out, s)
	}
	return out, errors.Join(errs...)
}
