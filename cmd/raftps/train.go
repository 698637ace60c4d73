package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/raftps/raftps/collective"
	"github.com/raftps/raftps/shard"
	"github.com/raftps/raftps/shard/shardpb"
	"github.com/raftps/raftps/store"
	"github.com/raftps/raftps/trainer"
)

// trainConfig is what raftps train (and the demo) runs.
type trainConfig struct {
	table     string
	model     string // lr or dlrm
	dim       int    // dlrm embedding dim
	hidden    string // dlrm hidden sizes, comma-separated
	optimizer string // of the table, when train creates it
	shards    int
	steps     int
	batch     int
	denseLR   float64
	fields    int
	vocab     int
	seed      uint64
	rank      int
	peers     string // collective addresses of every trainer, by rank
	job       string
	// listener, if set, is this trainer's collective listener on its
	// address in peers (the demo runs its trainers in one process).
	listener net.Listener
	quiet    bool // no progress lines (the other trainers of the demo)
}

func runTrain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("raftps train", flag.ContinueOnError)
	var cf clusterFlags
	cf.register(fs)
	var tc trainConfig
	fs.StringVar(&tc.table, "table", "", "embedding table (created if missing; default train_MODEL)")
	fs.StringVar(&tc.model, "model", "lr", "lr (logistic regression) or dlrm (embedding bags + MLP)")
	fs.IntVar(&tc.dim, "dim", 8, "embedding dimension (dlrm)")
	fs.StringVar(&tc.hidden, "hidden", "32,16", "hidden layer sizes (dlrm)")
	fs.StringVar(&tc.optimizer, "optimizer", "", "optimizer of the table when train creates it (default sgd:lr=2 for lr, adagrad:lr=0.1 for dlrm)")
	fs.IntVar(&tc.shards, "shards", 8, "shards of the table when train creates it")
	fs.IntVar(&tc.steps, "steps", 2000, "training steps per trainer")
	fs.IntVar(&tc.batch, "batch", 64, "samples per step and trainer")
	fs.Float64Var(&tc.denseLR, "dense-lr", 0, "SGD step of the dense parameters (default 2 for lr, 0.1 for dlrm)")
	fs.IntVar(&tc.fields, "fields", 8, "synthetic data: categorical fields")
	fs.IntVar(&tc.vocab, "vocab", 100, "synthetic data: ids per field (larger needs more steps to approach the Bayes AUC)")
	fs.Uint64Var(&tc.seed, "seed", 1, "synthetic data and dense initialisation seed (the same on every trainer)")
	fs.IntVar(&tc.rank, "rank", 0, "this trainer's rank, with --peers")
	fs.StringVar(&tc.peers, "peers", "", "collective addresses of every trainer, by rank (host:port,...); empty: one trainer")
	fs.StringVar(&tc.job, "job", "raftps-train", "job name: trainers of one job must agree on it")
	trainers := fs.Int("trainers", 1, "run this many synchronous trainer processes on this machine (rank 0 is this one)")
	fs.BoolVar(&tc.quiet, "quiet", false, "no progress output")
	if rc := parse(fs, args, stderr); rc >= 0 {
		return rc
	}
	if *trainers < 1 || (*trainers > 1 && tc.peers != "") {
		return fail(stderr, "train", fmt.Errorf("--trainers %d: want at least 1, and not together with --peers", *trainers))
	}
	if *trainers > 1 {
		wait, err := startTrainers(args, *trainers, &tc, stderr)
		if err != nil {
			return fail(stderr, "train", err)
		}
		defer func() {
			if err := wait(); err != nil {
				fmt.Fprintf(stderr, "raftps train: %v\n", err)
			}
		}()
	}
	tc.table = cmp.Or(tc.table, "train_"+tc.model)
	cl, err := cf.client()
	if err != nil {
		return fail(stderr, "train", err)
	}
	defer cl.Close()
	res, err := train(context.Background(), cl, tc, stderr)
	if err != nil {
		return fail(stderr, "train", err)
	}
	last := res.Evals[len(res.Evals)-1]
	if cf.json {
		_ = printJSON(stdout, trainJSON{
			Model: tc.model, Table: tc.table, Steps: res.Steps, Examples: res.Samples,
			WallS: res.Seconds, ExamplesPerS: res.SamplesPerS,
			FinalAUC: last.AUC, BayesAUC: last.BayesAUC, FinalLogLoss: last.LogLoss, BayesLogLoss: last.BayesLogLoss,
			Evals: res.Evals,
		})
		return 0
	}
	per := ""
	if tc.peers != "" {
		per = fmt.Sprintf(" (trainer %d of %d; each as many)", tc.rank, len(strings.Split(tc.peers, ",")))
	}
	fmt.Fprintf(stdout, "trained %s on table %s: %d steps, %d samples in %.1fs (%.0f samples/s)%s; held-out AUC %.4f, logloss %.4f (Bayes-optimal %.4f / %.4f)\n",
		tc.model, tc.table, res.Steps, res.Samples, res.Seconds, res.SamplesPerS, per, last.AUC, last.LogLoss, last.BayesAUC, last.BayesLogLoss)
	return 0
}

// startTrainers starts trainers 1..n-1 as child processes running this
// command with the same flags, and makes this process trainer 0 of the job.
// wait waits for the children and reports any that failed.
func startTrainers(args []string, n int, tc *trainConfig, stderr io.Writer) (wait func() error, err error) {
	var peers []string
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		peers = append(peers, ln.Addr().String())
		ln.Close()
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	tc.peers, tc.rank = strings.Join(peers, ","), 0
	var cmds []*exec.Cmd
	for r := 1; r < n; r++ {
		cmd := exec.Command(self, append(append([]string{"train"}, args...),
			"--trainers", "1", "--rank", fmt.Sprint(r), "--peers", tc.peers, "--quiet")...)
		cmd.Stderr = stderr
		if err := cmd.Start(); err != nil {
			for _, c := range cmds {
				_ = c.Process.Kill()
			}
			return nil, fmt.Errorf("starting trainer %d: %w", r, err)
		}
		cmds = append(cmds, cmd)
	}
	return func() error {
		var errs []error
		for i, c := range cmds {
			if err := c.Wait(); err != nil {
				errs = append(errs, fmt.Errorf("trainer %d: %w", i+1, err))
			}
		}
		return errors.Join(errs...)
	}, nil
}

// trainJSON is raftps train --json's summary.
type trainJSON struct {
	Model        string         `json:"model"`
	Table        string         `json:"table"`
	Steps        int            `json:"steps"`
	Examples     int            `json:"examples"`
	WallS        float64        `json:"wall_s"`
	ExamplesPerS float64        `json:"examples_per_s"`
	FinalAUC     float64        `json:"final_auc"`
	BayesAUC     float64        `json:"bayes_auc"`
	FinalLogLoss float64        `json:"final_logloss"`
	BayesLogLoss float64        `json:"bayes_logloss"`
	Evals        []trainer.Eval `json:"evals"`
}

// train creates the table if it does not exist, joins the other trainers if
// there are any, and runs the training loop.
func train(ctx context.Context, cl *shard.Client, tc trainConfig, progress io.Writer) (*trainer.Result, error) {
	if tc.quiet {
		progress = io.Discard
	}
	var model trainer.Model
	switch tc.model {
	case "lr":
		model = trainer.LR{}
		tc.optimizer = cmp.Or(tc.optimizer, "sgd:lr=2")
		if tc.denseLR == 0 {
			tc.denseLR = 2
		}
	case "dlrm":
		var hidden []int
		for _, h := range strings.Split(tc.hidden, ",") {
			var n int
			if _, err := fmt.Sscan(strings.TrimSpace(h), &n); err != nil || n < 1 {
				return nil, fmt.Errorf("--hidden %q: want positive sizes separated by commas", tc.hidden)
			}
			hidden = append(hidden, n)
		}
		m, err := trainer.NewDLRM(trainer.DLRMConfig{Fields: tc.fields, Dim: tc.dim, Hidden: hidden})
		if err != nil {
			return nil, err
		}
		model = m
		tc.optimizer = cmp.Or(tc.optimizer, "adagrad:lr=0.1")
		if tc.denseLR == 0 {
			tc.denseLR = 0.1
		}
	default:
		return nil, fmt.Errorf("--model %q: want lr or dlrm", tc.model)
	}
	tc.table = cmp.Or(tc.table, "train_"+tc.model)
	dcfg := trainer.DefaultSyntheticConfig()
	dcfg.Fields, dcfg.Vocab, dcfg.Seed = tc.fields, tc.vocab, tc.seed
	if tc.vocab <= 1000 {
		// A small vocabulary with the default weight spread makes an easy
		// problem; widen it so the Bayes AUC stays near Criteo's 0.8.
		dcfg.WeightStd = 0.5
	}
	data, err := trainer.NewSynthetic(dcfg)
	if err != nil {
		return nil, err
	}
	init := "zeros"
	if tc.model == "dlrm" {
		init = "uniform:0.05"
	}
	_, err = cl.CreateTable(ctx, &shardpb.TableSpec{Name: tc.table, Dim: uint32(model.Dim()), Shards: uint32(tc.shards), Optimizer: tc.optimizer, Initializer: init})
	switch {
	case errors.Is(err, store.ErrTableExists):
		d, derr := cl.Describe(ctx, tc.table)
		if derr != nil {
			return nil, derr
		}
		if int(d.Spec.Dim) != model.Dim() {
			return nil, fmt.Errorf("table %q has dim %d; model %s needs %d", tc.table, d.Spec.Dim, tc.model, model.Dim())
		}
		fmt.Fprintf(progress, "training on existing table %s (%s)\n", tc.table, d.Spec.Optimizer)
	case err != nil:
		return nil, err
	default:
		fmt.Fprintf(progress, "created table %s (dim %d, %d shards, %s)\n", tc.table, model.Dim(), tc.shards, tc.optimizer)
	}
	cfg := trainer.LoopConfig{PS: cl, Table: tc.table, Model: model, Data: data, Batch: tc.batch, Steps: tc.steps,
		DenseLR: float32(tc.denseLR), Seed: tc.seed, Progress: progress, ProgressEvery: max(1, tc.steps/10)}
	if tc.peers != "" {
		addrs := strings.Split(tc.peers, ",")
		jctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		g, err := collective.Join(jctx, collective.Config{Rank: tc.rank, Addrs: addrs, Job: tc.job, Generation: 1, Listener: tc.listener})
		cancel()
		if err != nil {
			return nil, fmt.Errorf("joining the other trainers: %w", err)
		}
		defer g.Close()
		cfg.Group = g
		fmt.Fprintf(progress, "trainer %d of %d joined\n", tc.rank, len(addrs))
	}
	return trainer.Train(ctx, cfg)
}
