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
	job       string
	table     string // embedding table; default the job name
	model     string // lr or dlrm
	dim       int    // dlrm embedding dim
	hidden    string // dlrm hidden sizes, comma-separated
	optimizer string // of the table, when train creates it
	shards    int
	steps     int
	batch     int
	denseLR   float64
	data      string // synthetic, criteo:PATH or libsvm:PATH
	holdOut   float64
	examples  int // synthetic: 0 for an endless stream
	fields    int
	vocab     int
	seed      uint64
	mode      string
	backup    int
	slowRank  int
	slowdown  float64
	ckptEvery int
	evalEvery int
	evalN     int
	rank      int
	world     int
	peers     string // static collective addresses by rank; empty: the cluster's job registry
	listen    string // collective listen address to register
	// listener, if set, is this trainer's collective listener on its
	// address in peers (the demo runs its trainers in one process).
	listener net.Listener
	quiet    bool // no progress lines (the other trainers of the demo)
	// afterStep is the demo's hook on trainer 0's steps.
	afterStep func(step int, e *trainer.Eval)
}

func (tc *trainConfig) register(fs *flag.FlagSet) {
	fs.StringVar(&tc.job, "job", "", "job name (default train_MODEL): a job restarted under its name resumes; trainers of one job must agree on it")
	fs.StringVar(&tc.table, "table", "", "embedding table (created if missing; default the job name)")
	fs.StringVar(&tc.model, "model", "lr", "lr (logistic regression) or dlrm (embedding bags + MLP)")
	fs.IntVar(&tc.dim, "dim", 8, "embedding dimension (dlrm)")
	fs.StringVar(&tc.hidden, "hidden", "32,16", "hidden layer sizes (dlrm)")
	fs.StringVar(&tc.optimizer, "optimizer", "", "optimizer of the table when train creates it (default adagrad:lr=0.2 for lr, adagrad:lr=0.1 for dlrm)")
	fs.IntVar(&tc.shards, "shards", 8, "shards of the embedding table when train creates it")
	fs.IntVar(&tc.steps, "steps", 2000, "training steps per trainer (a resumed job goes on to this step)")
	fs.IntVar(&tc.batch, "batch", 64, "samples per step and trainer")
	fs.Float64Var(&tc.denseLR, "dense-lr", 0, "SGD step of the dense parameters (default 0.5 for lr, 0.1 for dlrm)")
	fs.StringVar(&tc.data, "data", "synthetic", "synthetic, criteo:PATH (Criteo TSV) or libsvm:PATH")
	fs.Float64Var(&tc.holdOut, "holdout", 0.1, "criteo and libsvm: the fraction of the file, from its end, held out for evaluation")
	fs.IntVar(&tc.examples, "examples", 0, "synthetic data: training examples (read in epochs); 0 for an endless stream")
	fs.IntVar(&tc.fields, "fields", 8, "synthetic data: categorical fields")
	fs.IntVar(&tc.vocab, "vocab", 100, "synthetic data: ids per field (larger needs more steps to approach the Bayes AUC)")
	fs.Uint64Var(&tc.seed, "seed", 1, "synthetic data and dense initialisation seed (the same on every trainer)")
	fs.StringVar(&tc.mode, "mode", "sync", "sync, async or ssp:S (a trainer runs at most S steps ahead of the slowest)")
	fs.IntVar(&tc.backup, "backup-workers", 0, "sync: each step goes on with the first N-B trainers' gradients and discards the late ones")
	fs.IntVar(&tc.slowRank, "slow-rank", -1, "make this rank a straggler (with --slowdown)")
	fs.Float64Var(&tc.slowdown, "slowdown", 3, "how many times slower --slow-rank runs")
	fs.IntVar(&tc.ckptEvery, "checkpoint-every", 100, "sync: trainer 0 checkpoints the dense parameters into the job's state table every this many steps")
	fs.IntVar(&tc.evalEvery, "eval-every", 0, "evaluate every this many steps (default steps/5)")
	fs.IntVar(&tc.evalN, "eval-samples", 20000, "synthetic data: held-out samples per evaluation")
	fs.IntVar(&tc.rank, "rank", 0, "this trainer's rank (0..world-1; -1: let the cluster's job registry assign one)")
	fs.IntVar(&tc.world, "world", 1, "trainers in the job, when they are started one by one (see --trainers)")
	fs.StringVar(&tc.peers, "peers", "", "collective addresses of every trainer, by rank (host:port,...); empty: trainers find each other through the cluster")
	fs.StringVar(&tc.listen, "listen", "127.0.0.1:0", "collective listen address this trainer registers with the cluster (must be reachable by the other trainers)")
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
	if *trainers < 1 || (*trainers > 1 && (tc.peers != "" || tc.world != 1)) {
		return fail(stderr, "train", fmt.Errorf("--trainers %d: want at least 1, and not together with --peers or --world", *trainers))
	}
	if tc.peers != "" {
		tc.world = len(strings.Split(tc.peers, ","))
	}
	tc.job = cmp.Or(tc.job, "train_"+tc.model)
	var children *trainerProcs
	if *trainers > 1 {
		tc.world, tc.rank = *trainers, 0
	}
	if _, err := tc.check(); err != nil {
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
	res, err := train(context.Background(), cl, tc, stderr)
	var others []trainJSON
	if children != nil {
		var werr error
		others, werr = children.wait()
		err = errors.Join(err, werr)
	}
	if err != nil {
		return fail(stderr, "train", err)
	}
	out := summary(tc, res, others)
	if cf.json {
		_ = printJSON(stdout, out)
		return 0
	}
	if len(res.Evals) == 0 {
		fmt.Fprintf(stdout, "trainer %d of job %s: %d steps (%s), %d samples in %.1fs (%.0f samples/s)\n", res.Rank, tc.job, res.Steps, res.Mode, res.Samples, res.Seconds, res.SamplesPerS)
		return 0
	}
	fmt.Fprintf(stdout, "trained %s (job %s, %s, %d trainers): steps %d-%d, %.0f samples/s in all, %.1fs; held-out AUC %.4f, logloss %.4f (Bayes-optimal %s / %s); pull p50 %.1f ms, push p50 %.1f ms\n",
		tc.model, tc.job, res.Mode, res.World, res.FirstStep, res.Steps, out.ExamplesPerS, res.Seconds,
		out.FinalAUC, out.FinalLogLoss, optional(out.BayesAUC), optional(out.BayesLogLoss), res.Pull.P50, res.Push.P50)
	return 0
}

func optional(v trainer.Optional) string {
	if math.IsNaN(float64(v)) {
		return "unknown"
	}
	return fmt.Sprintf("%.4f", float64(v))
}

// trainJSON is raftps train --json's summary: of the job on trainer 0, of
// the trainer on the others.
type trainJSON struct {
	Job          string           `json:"job"`
	Model        string           `json:"model"`
	Table        string           `json:"table"`
	Mode         string           `json:"mode"`
	Rank         int              `json:"rank"`
	Trainers     int              `json:"trainers"`
	FirstStep    int              `json:"first_step"`
	Steps        int              `json:"steps"`
	Examples     int              `json:"examples"`
	Late         int              `json:"late_steps"`
	WallS        float64          `json:"wall_s"`
	ExamplesPerS float64          `json:"examples_per_s"`
	FinalAUC     float64          `json:"final_auc"`
	BayesAUC     trainer.Optional `json:"bayes_auc"`
	FinalLogLoss float64          `json:"final_logloss"`
	BayesLogLoss trainer.Optional `json:"bayes_logloss"`
	// TimeToTarget is the training time (evaluations excluded) until
	// the held-out AUC first came within 0.01 of the Bayes-optimal one;
	// null if it never did or the Bayes-optimal AUC is unknown.
	TimeToTarget trainer.Optional `json:"time_to_target_s"`
	Pull         trainer.Latency  `json:"pull"`
	Push         trainer.Latency  `json:"push"`
	Evals        []trainer.Eval   `json:"evals"`
}

// summary is res as JSON; with the other local trainers' summaries, the
// examples and examples/s are the job's.
func summary(tc trainConfig, res *trainer.Result, others []trainJSON) trainJSON {
	out := trainJSON{Job: tc.job, Model: tc.model, Table: cmp.Or(tc.table, tc.job), Mode: res.Mode, Rank: res.Rank, Trainers: res.World,
		FirstStep: res.FirstStep, Steps: res.Steps, Examples: res.Samples, Late: res.Late, WallS: res.Seconds, ExamplesPerS: res.SamplesPerS,
		Pull: res.Pull, Push: res.Push, Evals: res.Evals, BayesAUC: trainer.Optional(math.NaN()), BayesLogLoss: trainer.Optional(math.NaN()),
		TimeToTarget: trainer.Optional(math.NaN())}
	for _, e := range res.Evals {
		if e.AUC >= float64(e.BayesAUC)-0.01 {
			out.TimeToTarget = trainer.Optional(e.Seconds)
			break
		}
	}
	for _, o := range others {
		out.Examples += o.Examples
		out.ExamplesPerS += o.ExamplesPerS
	}
	if len(res.Evals) > 0 {
		last := res.Evals[len(res.Evals)-1]
		out.FinalAUC, out.FinalLogLoss, out.BayesAUC, out.BayesLogLoss = last.AUC, last.LogLoss, last.BayesAUC, last.BayesLogLoss
	}
	return out
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
func (p *trainerProcs) wait() ([]trainJSON, error) {
	var errs []error
	var out []trainJSON
	for i, c := range p.cmds {
		if err := c.Wait(); err != nil {
			errs = append(errs, fmt.Errorf("trainer %d: %w", i+1, err))
			continue
		}
		var s trainJSON
		if err := json.Unmarshal(p.outs[i].Bytes(), &s); err != nil {
			errs = append(errs, fmt.Errorf("trainer %d: reading its summary: %w", i+1, err))
			continue
		}
		out = append(out, s)
	}
	return out, errors.Join(errs...)
}

// setup is a trainer's model and data.
type setup struct {
	model trainer.Model
	data  trainer.Dataset
	eval  []trainer.Sample
}

// prepare builds the model and data set of tc and fills its defaults.
func prepare(tc *trainConfig, progress io.Writer) (*setup, error) {
	var su setup
	shape := trainer.Shape{Fields: tc.fields}
	switch {
	case tc.data == "synthetic":
		dcfg := trainer.DefaultSyntheticConfig()
		dcfg.Fields, dcfg.Vocab, dcfg.Seed = tc.fields, tc.vocab, tc.seed
		s, err := trainer.NewSynthetic(dcfg)
		if err != nil {
			return nil, err
		}
		su.data = s
		if tc.examples > 0 {
			su.data = trainer.SampleSet(s.Samples(0, tc.examples))
		}
		if tc.evalN < 2 {
			return nil, fmt.Errorf("--eval-samples %d: want at least 2", tc.evalN)
		}
		su.eval = s.Samples(trainer.HeldOut, tc.evalN)
	default:
		t0 := time.Now()
		train, eval, err := trainer.LoadSpec(tc.data, tc.holdOut)
		if err != nil {
			return nil, err
		}
		if shape, err = trainer.ShapeOf(append(train[:len(train):len(train)], eval...)); err != nil {
			return nil, err
		}
		su.data, su.eval = train, eval
		fmt.Fprintf(progress, "read %s in %.1fs: %d training and %d held-out samples, %d fields, %d dense features\n",
			tc.data, time.Since(t0).Seconds(), len(train), len(eval), shape.Fields, shape.DenseIn)
	}
	switch tc.model {
	case "lr":
		su.model = trainer.LR{DenseIn: shape.DenseIn}
		tc.optimizer = cmp.Or(tc.optimizer, "adagrad:lr=0.2")
		if tc.denseLR == 0 {
			tc.denseLR = 0.5
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
		m, err := trainer.NewDLRM(trainer.DLRMConfig{Fields: max(shape.Fields, 1), Dim: tc.dim, DenseIn: shape.DenseIn, Hidden: hidden})
		if err != nil {
			return nil, err
		}
		su.model = m
		tc.optimizer = cmp.Or(tc.optimizer, "adagrad:lr=0.1")
		if tc.denseLR == 0 {
			tc.denseLR = 0.1
		}
	default:
		return nil, fmt.Errorf("--model %q: want lr or dlrm", tc.model)
	}
	return &su, nil
}

// ensureTable creates spec's table, or checks that the existing one has its
// dimension and, if exact, its optimizer (a user may create the embedding
// table with another optimizer; the job's state tables need theirs).
func ensureTable(ctx context.Context, cl *shard.Client, spec *shardpb.TableSpec, exact bool, progress io.Writer) error {
	_, err := cl.CreateTable(ctx, spec)
	switch {
	case errors.Is(err, store.ErrTableExists):
		d, derr := cl.Describe(ctx, spec.Name)
		if derr != nil {
			return derr
		}
		if d.Spec.Dim != spec.Dim {
			return fmt.Errorf("table %q has dim %d; this job needs %d (use another --job or --table)", spec.Name, d.Spec.Dim, spec.Dim)
		}
		if want, err := store.ParseOptimizer(spec.Optimizer); exact && (err != nil || d.Spec.Optimizer != want.String()) {
			return fmt.Errorf("table %q has optimizer %s; this job needs %s (use another --job)", spec.Name, d.Spec.Optimizer, spec.Optimizer)
		}
		fmt.Fprintf(progress, "using existing table %s (dim %d, %s)\n", spec.Name, d.Spec.Dim, d.Spec.Optimizer)
		return nil
	case err != nil:
		return err
	}
	fmt.Fprintf(progress, "created table %s (dim %d, %d shards, %s)\n", spec.Name, spec.Dim, spec.Shards, spec.Optimizer)
	return nil
}

// check validates the flags that do not need the cluster or the data.
func (tc *trainConfig) check() (trainer.Mode, error) {
	mode, err := trainer.ParseMode(tc.mode)
	if err != nil {
		return mode, err
	}
	switch {
	case tc.world < 1 || tc.world > collective.MaxRanks:
		return mode, fmt.Errorf("--world %d: want 1..%d", tc.world, collective.MaxRanks)
	case tc.rank < -1 || tc.rank >= tc.world:
		return mode, fmt.Errorf("--rank %d: want 0..%d (or -1 to be assigned one)", tc.rank, tc.world-1)
	case tc.rank == -1 && tc.peers != "":
		return mode, errors.New("--rank -1 needs the cluster's job registry, not --peers")
	case tc.backup < 0 || (tc.backup > 0 && (tc.backup >= tc.world || mode.Kind != trainer.Sync)):
		return mode, fmt.Errorf("--backup-workers %d: want fewer than the %d trainers, in sync mode", tc.backup, tc.world)
	case tc.ckptEvery < 0:
		return mode, fmt.Errorf("--checkpoint-every %d: want 0 (never) or more", tc.ckptEvery)
	}
	return mode, nil
}

// train prepares the job's tables, forms the trainer group and runs the
// training loop. A synchronous trainer whose group breaks (a peer died)
// while trainers find each other through the cluster re-forms the group
// with whoever joins next and resumes from the job's checkpoint.
func train(ctx context.Context, cl *shard.Client, tc trainConfig, progress io.Writer) (*trainer.Result, error) {
	if tc.quiet {
		progress = io.Discard
	}
	mode, err := tc.check()
	if err != nil {
		return nil, err
	}
	tc.job = cmp.Or(tc.job, "train_"+tc.model)
	tc.table = cmp.Or(tc.table, tc.job)
	su, err := prepare(&tc, progress)
	if err != nil {
		return nil, err
	}
	init := "zeros"
	if tc.model == "dlrm" {
		init = "uniform:0.05"
	}
	specs := []*shardpb.TableSpec{{Name: tc.table, Dim: uint32(su.model.Dim()), Shards: uint32(tc.shards), Optimizer: tc.optimizer, Initializer: init}}
	stateTable, denseTable := "", ""
	if mode.Kind != trainer.Sync || tc.ckptEvery > 0 {
		stateTable = tc.job + ".state"
		specs = append(specs, &shardpb.TableSpec{Name: stateTable, Dim: trainer.StateDim, Shards: 1, Optimizer: trainer.StateTableOptimizer})
	}
	if mode.Kind != trainer.Sync {
		denseTable = tc.job + ".dense"
		specs = append(specs, &shardpb.TableSpec{Name: denseTable, Dim: trainer.StateDim, Shards: 1, Optimizer: trainer.DenseTableOptimizer})
	}
	for i, s := range specs {
		if err := ensureTable(ctx, cl, s, i > 0, progress); err != nil {
			return nil, err
		}
	}
	cfg := trainer.LoopConfig{PS: cl, Table: tc.table, Model: su.model, Data: su.data, Eval: su.eval, Batch: tc.batch, Steps: tc.steps,
		DenseLR: float32(tc.denseLR), Mode: mode, Rank: max(tc.rank, 0), World: tc.world, StateTable: stateTable, DenseTable: denseTable,
		CheckpointEvery: max(tc.ckptEvery, tc.steps+1), Seed: tc.seed, EvalEvery: tc.evalEvery, EvalSamples: tc.evalN,
		Progress: progress, ProgressEvery: max(1, tc.steps/10), AfterStep: tc.afterStep}
	if tc.ckptEvery > 0 {
		cfg.CheckpointEvery = tc.ckptEvery
	}
	if mode.Kind != trainer.Sync || tc.world == 1 {
		if tc.rank == -1 {
			return nil, errors.New("--rank -1: asynchronous trainers and single trainers need an explicit rank")
		}
		if tc.rank == tc.slowRank {
			cfg.Slowdown = tc.slowdown
		}
		return trainer.Train(ctx, cfg)
	}
	for reforms := 0; ; reforms++ {
		res, err := trainSync(ctx, cl, tc, cfg, progress)
		broken := errors.Is(err, collective.ErrPeerFailed) || errors.Is(err, collective.ErrGroupBroken)
		if err == nil || tc.peers != "" || !broken || reforms == 10 {
			return res, err
		}
		fmt.Fprintf(progress, "trainer group broke (%v); re-forming it through the cluster and resuming from the checkpoint\n", err)
	}
}

// trainSync forms the group of a synchronous job (allreduce, or a quorum
// with backup workers) and trains.
func trainSync(ctx context.Context, cl *shard.Client, tc trainConfig, cfg trainer.LoopConfig, progress io.Writer) (*trainer.Result, error) {
	var (
		addrs []string
		round uint64 = 1
		rank         = tc.rank
		ln           = tc.listener
	)
	if tc.peers != "" {
		addrs = strings.Split(tc.peers, ",")
	} else {
		var err error
		if addrs, rank, round, ln, err = rendezvous(ctx, cl, tc, progress); err != nil {
			return nil, err
		}
	}
	jctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	ccfg := collective.Config{Rank: rank, Addrs: addrs, Job: tc.job, Generation: round, Listener: ln}
	if rank == tc.slowRank {
		cfg.Slowdown = tc.slowdown
	}
	if tc.backup > 0 {
		plan, err := trainer.PlanQuorum(ctx, cfg)
		if err != nil {
			return nil, err
		}
		qcfg := collective.QuorumConfig{Config: ccfg, Need: tc.world - tc.backup, Steps: plan.Steps, Initial: plan.Initial}
		if rank == 0 {
			qcfg.Update = plan.Update
		}
		q, err := collective.JoinQuorum(jctx, qcfg)
		if err != nil {
			return nil, fmt.Errorf("joining the other trainers: %w", err)
		}
		defer q.Close()
		cfg.Quorum = q
	} else {
		g, err := collective.Join(jctx, ccfg)
		if err != nil {
			return nil, fmt.Errorf("joining the other trainers: %w", err)
		}
		defer g.Close()
		cfg.Group = g
	}
	cancel()
	fmt.Fprintf(progress, "trainer %d of %d joined job %s (generation %d)\n", rank, len(addrs), tc.job, round)
	res, err := trainer.Train(ctx, cfg)
	if err == nil && rank == 0 && tc.peers == "" {
		if derr := cl.DeleteJob(ctx, tc.job); derr != nil {
			fmt.Fprintf(progress, "removing job %s from the registry: %v\n", tc.job, derr)
		}
	}
	return res, err
}

// rendezvous registers this trainer's collective address with the cluster's
// job registry and waits for the round to fill; a round that another
// trainer replaced is joined again.
func rendezvous(ctx context.Context, cl *shard.Client, tc trainConfig, progress io.Writer) (addrs []string, rank int, round uint64, ln net.Listener, err error) {
	l := tc.listener
	if l == nil {
		if l, err = net.Listen("tcp", tc.listen); err != nil {
			return nil, 0, 0, nil, fmt.Errorf("--listen %s: %w", tc.listen, err)
		}
	}
	defer func() {
		if err != nil && l != nil { // the return statement has set ln to nil
			l.Close()
		}
	}()
	ln = l
	wctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	for {
		rank, round, err = cl.JoinJob(wctx, tc.job, tc.world, tc.rank, l.Addr().String())
		if err != nil {
			return nil, 0, 0, nil, fmt.Errorf("registering with job %s: %w", tc.job, err)
		}
		fmt.Fprintf(progress, "trainer %d registered with job %s (round %d) at %s; waiting for %d trainers\n", rank, tc.job, round, l.Addr(), tc.world)
		info, err := cl.WaitJob(wctx, tc.job, round)
		if errors.Is(err, shard.ErrJobRoundChanged) {
			continue
		}
		if err != nil {
			return nil, 0, 0, nil, fmt.Errorf("waiting for the trainers of job %s: %w", tc.job, err)
		}
		return info.Addrs, rank, round, l, nil
	}
}
