package trainer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/raftps/raftps/collective"
	"github.com/raftps/raftps/shard/client"
	"github.com/raftps/raftps/store"
)

// JobConfig is one trainer's part in a training job against a raftps
// cluster: what raftps train and the demo run (RunJob).
type JobConfig struct {
	// Job names the job: a job restarted under its name resumes, and its
	// trainers must agree on it. Table is its embedding table (default:
	// the job's name), created with Shards shards and Optimizer if missing.
	Job, Table string
	Shards     int
	Optimizer  string
	// GradPrecision of the embedding table when the job creates it:
	// client.GradFP32 (the default) or client.GradBF16.
	GradPrecision client.GradPrecision
	// Model: "lr" or "dlrm" (embedding bags of Dim and an MLP of Hidden).
	Model  string
	Dim    int
	Hidden []int
	// Steps per trainer (a resumed job goes on to this step), Batch samples
	// per step, DenseLR the dense parameters' SGD step (0: the model's
	// default).
	Steps, Batch int
	DenseLR      float64
	// Data: "synthetic" (Examples examples, 0 for an endless stream, of
	// Fields fields over Vocab ids, seeded by Seed) or criteo:PATH or
	// libsvm:PATH (HoldOut of the file held out).
	Data                    string
	HoldOut                 float64
	Examples, Fields, Vocab int
	Seed                    uint64
	// Mode: "sync", "async" or "ssp:S"; BackupWorkers of a sync job's
	// trainers may be late each step; SlowRank is made Slowdown times
	// slower (-1: none).
	Mode          string
	BackupWorkers int
	SlowRank      int
	Slowdown      float64
	// CheckpointEvery steps trainer 0 of a sync job checkpoints the dense
	// parameters (0: never); EvalEvery steps it evaluates on EvalSamples
	// held-out samples.
	CheckpointEvery, EvalEvery, EvalSamples int
	// Rank of World trainers (-1: assigned by the cluster's job registry).
	Rank, World int
	// Peers are every trainer's collective address by rank; empty: the
	// trainers find each other through the cluster's job registry, this
	// one listening on Listen (or on Listener, if set, whose address is
	// its entry in Peers).
	Peers    []string
	Listen   string
	Listener net.Listener
	// AfterStep, if set, is called after each of this trainer's steps.
	AfterStep func(step int, e *Eval)
	// Metrics, if set, gets the trainer's metrics (NewMetrics).
	Metrics prometheus.Registerer `json:"-"`
}

// setup is a trainer's model and data.
type setup struct {
	model Model
	data  Dataset
	eval  []Sample
}

// prepare builds the model and data set of tc and fills its defaults.
func prepare(tc *JobConfig, progress io.Writer) (*setup, error) {
	var su setup
	shape := Shape{Fields: tc.Fields}
	switch {
	case tc.Data == "synthetic":
		dcfg := DefaultSyntheticConfig()
		dcfg.Fields, dcfg.Vocab, dcfg.Seed = tc.Fields, tc.Vocab, tc.Seed
		s, err := NewSynthetic(dcfg)
		if err != nil {
			return nil, err
		}
		su.data = s
		if tc.Examples > 0 {
			su.data = SampleSet(s.Samples(0, tc.Examples))
		}
		if tc.EvalSamples < 2 {
			return nil, fmt.Errorf("job config: EvalSamples %d: want at least 2", tc.EvalSamples)
		}
		su.eval = s.Samples(HeldOut, tc.EvalSamples)
	default:
		t0 := time.Now()
		train, eval, err := LoadSpec(tc.Data, tc.HoldOut)
		if err != nil {
			return nil, err
		}
		if shape, err = ShapeOf(append(train[:len(train):len(train)], eval...)); err != nil {
			return nil, err
		}
		su.data, su.eval = train, eval
		fmt.Fprintf(progress, "read %s in %.1fs: %d training and %d held-out samples, %d fields, %d dense features\n",
			tc.Data, time.Since(t0).Seconds(), len(train), len(eval), shape.Fields, shape.DenseIn)
	}
	switch tc.Model {
	case "lr":
		su.model = LR{DenseIn: shape.DenseIn}
		tc.Optimizer = cmp.Or(tc.Optimizer, "adagrad:lr=0.2")
		if tc.DenseLR == 0 {
			tc.DenseLR = 0.5
		}
	case "dlrm":
		m, err := NewDLRM(DLRMConfig{Fields: max(shape.Fields, 1), Dim: tc.Dim, DenseIn: shape.DenseIn, Hidden: tc.Hidden})
		if err != nil {
			return nil, err
		}
		su.model = m
		tc.Optimizer = cmp.Or(tc.Optimizer, "adagrad:lr=0.1")
		if tc.DenseLR == 0 {
			tc.DenseLR = 0.1
		}
	default:
		return nil, fmt.Errorf("job config: Model %q: want lr or dlrm", tc.Model)
	}
	return &su, nil
}

// ensureTable creates spec's table, or checks that the existing one has its
// dimension and, if exact, its optimizer (a user may create the embedding
// table with another optimizer; the job's state tables need theirs).
func ensureTable(ctx context.Context, cl *client.Client, spec client.TableSpec, exact bool, progress io.Writer) error {
	_, err := cl.Tables().Create(ctx, spec)
	switch {
	case errors.Is(err, client.ErrTableExists):
		d, derr := cl.Tables().Describe(ctx, spec.Name)
		if derr != nil {
			return derr
		}
		if d.Spec.Dim != spec.Dim {
			return fmt.Errorf("table %q has dim %d; this job needs %d (use another job or table name)", spec.Name, d.Spec.Dim, spec.Dim)
		}
		if want, err := store.ParseOptimizer(spec.Optimizer); exact && (err != nil || d.Spec.Optimizer != want.String()) {
			return fmt.Errorf("table %q has optimizer %s; this job needs %s (use another job name)", spec.Name, d.Spec.Optimizer, spec.Optimizer)
		}
		fmt.Fprintf(progress, "using existing table %s (dim %d, %s)\n", spec.Name, d.Spec.Dim, d.Spec.Optimizer)
		return nil
	case err != nil:
		return err
	}
	fmt.Fprintf(progress, "created table %s (dim %d, %d shards, %s)\n", spec.Name, spec.Dim, spec.Shards, spec.Optimizer)
	return nil
}

// Check validates what does not need the cluster or the data, and returns
// the job's mode.
func (tc *JobConfig) Check() (Mode, error) {
	mode, err := ParseMode(tc.Mode)
	if err != nil {
		return mode, err
	}
	switch {
	case tc.World < 1 || tc.World > collective.MaxRanks:
		return mode, fmt.Errorf("job config: World %d: want 1..%d", tc.World, collective.MaxRanks)
	case tc.Rank < -1 || tc.Rank >= tc.World:
		return mode, fmt.Errorf("job config: Rank %d: want 0..%d (or -1 to be assigned one)", tc.Rank, tc.World-1)
	case tc.Rank == -1 && len(tc.Peers) > 0:
		return mode, errors.New("job config: Rank -1 needs the cluster's job registry, not Peers")
	case tc.BackupWorkers < 0 || (tc.BackupWorkers > 0 && (tc.BackupWorkers >= tc.World || mode.Kind != Sync)):
		return mode, fmt.Errorf("job config: BackupWorkers %d: want fewer than the %d trainers, in sync mode", tc.BackupWorkers, tc.World)
	case tc.CheckpointEvery < 0:
		return mode, fmt.Errorf("job config: CheckpointEvery %d: want 0 (never) or more", tc.CheckpointEvery)
	}
	return mode, nil
}

// RunJob prepares the job's tables on the cluster, forms the trainer group
// and runs the training loop: one trainer's part of a job (raftps train, the
// demo). A synchronous trainer whose group breaks (a peer died) while
// trainers find each other through the cluster re-forms the group with
// whoever joins next and resumes from the job's checkpoint (at most 10
// times). progress, if set, hears what it does.
func RunJob(ctx context.Context, cl *client.Client, tc JobConfig, progress io.Writer) (*Result, error) {
	if progress == nil {
		progress = io.Discard
	}
	mode, err := tc.Check()
	if err != nil {
		return nil, err
	}
	tc.Job = cmp.Or(tc.Job, "train_"+tc.Model)
	tc.Table = cmp.Or(tc.Table, tc.Job)
	su, err := prepare(&tc, progress)
	if err != nil {
		return nil, err
	}
	init := "zeros"
	if tc.Model == "dlrm" {
		init = "uniform:0.05"
	}
	specs := []client.TableSpec{{Name: tc.Table, Dim: su.model.Dim(), Shards: tc.Shards, Optimizer: tc.Optimizer, Initializer: init, GradPrecision: tc.GradPrecision}}
	stateTable, denseTable := "", ""
	if mode.Kind != Sync || tc.CheckpointEvery > 0 {
		stateTable = tc.Job + ".state"
		specs = append(specs, client.TableSpec{Name: stateTable, Dim: StateDim, Shards: 1, Optimizer: StateTableOptimizer})
	}
	if mode.Kind != Sync {
		denseTable = tc.Job + ".dense"
		specs = append(specs, client.TableSpec{Name: denseTable, Dim: StateDim, Shards: 1, Optimizer: DenseTableOptimizer})
	}
	for i, s := range specs {
		if err := ensureTable(ctx, cl, s, i > 0, progress); err != nil {
			return nil, err
		}
	}
	cfg := LoopConfig{PS: clientPS{cl}, Table: tc.Table, Model: su.model, Data: su.data, Eval: su.eval, Batch: tc.Batch, Steps: tc.Steps,
		DenseLR: float32(tc.DenseLR), Mode: mode, Rank: max(tc.Rank, 0), World: tc.World, StateTable: stateTable, DenseTable: denseTable,
		CheckpointEvery: max(tc.CheckpointEvery, tc.Steps+1), Seed: tc.Seed, EvalEvery: tc.EvalEvery, EvalSamples: tc.EvalSamples,
		Progress: progress, ProgressEvery: max(1, tc.Steps/10), AfterStep: tc.AfterStep}
	if tc.CheckpointEvery > 0 {
		cfg.CheckpointEvery = tc.CheckpointEvery
	}
	if tc.Rank == 0 {
		cfg.AfterStep = reportEvals(cl, tc.Job, progress, tc.AfterStep)
	}
	if tc.Metrics != nil {
		rank := "assigned"
		if tc.Rank >= 0 {
			rank = strconv.Itoa(tc.Rank)
		}
		cfg.Metrics = NewMetrics(tc.Metrics, tc.Job, rank)
	}
	if mode.Kind != Sync || tc.World == 1 {
		if tc.Rank == -1 {
			return nil, errors.New("job config: Rank -1: asynchronous trainers and single trainers need an explicit rank")
		}
		if tc.Rank == tc.SlowRank {
			cfg.Slowdown = tc.Slowdown
		}
		return Train(ctx, cfg)
	}
	for reforms := 0; ; reforms++ {
		res, err := trainSync(ctx, cl, tc, cfg, progress)
		broken := errors.Is(err, collective.ErrPeerFailed) || errors.Is(err, collective.ErrGroupBroken)
		if err == nil || len(tc.Peers) > 0 || !broken || reforms == 10 {
			return res, err
		}
		fmt.Fprintf(progress, "trainer group broke (%v); re-forming it through the cluster and resuming from the checkpoint\n", err)
	}
}

// trainSync forms the group of a synchronous job (allreduce, or a quorum
// with backup workers) and trains.
func trainSync(ctx context.Context, cl *client.Client, tc JobConfig, cfg LoopConfig, progress io.Writer) (*Result, error) {
	var (
		addrs []string
		round uint64 = 1
		rank         = tc.Rank
		ln           = tc.Listener
	)
	if len(tc.Peers) > 0 {
		addrs = tc.Peers
	} else {
		var err error
		if addrs, rank, round, ln, err = rendezvous(ctx, cl, tc, nonEmpty(cfg.Table, cfg.StateTable, cfg.DenseTable), progress); err != nil {
			return nil, err
		}
	}
	jctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	ccfg := collective.Config{Rank: rank, Addrs: addrs, Job: tc.Job, Generation: round, Listener: ln}
	if rank == tc.SlowRank {
		cfg.Slowdown = tc.Slowdown
	}
	if tc.BackupWorkers > 0 {
		plan, err := PlanQuorum(ctx, cfg)
		if err != nil {
			return nil, err
		}
		qcfg := collective.QuorumConfig{Config: ccfg, Need: tc.World - tc.BackupWorkers, Steps: plan.Steps, Initial: plan.Initial}
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
	fmt.Fprintf(progress, "trainer %d of %d joined job %s (generation %d)\n", rank, len(addrs), tc.Job, round)
	res, err := Train(ctx, cfg)
	if err == nil && rank == 0 && len(tc.Peers) == 0 {
		if derr := cl.Jobs().Delete(ctx, tc.Job); derr != nil {
			fmt.Fprintf(progress, "removing job %s from the registry: %v\n", tc.Job, derr)
		}
	}
	return res, err
}

// nonEmpty returns the strings that are not empty.
func nonEmpty(ss ...string) []string {
	var out []string
	for _, s := range ss {
		if s != "" {
			out = append(out, s)
		}
	}
	return out
}

// rendezvous registers this trainer's collective address with the cluster's
// job registry, naming the job's tables (which the cluster then refuses to
// drop while the job is registered), and waits for the round to fill; a
// round that another trainer replaced is joined again.
func rendezvous(ctx context.Context, cl *client.Client, tc JobConfig, tables []string, progress io.Writer) (addrs []string, rank int, round uint64, ln net.Listener, err error) {
	l := tc.Listener
	if l == nil {
		if l, err = net.Listen("tcp", tc.Listen); err != nil {
			return nil, 0, 0, nil, fmt.Errorf("listening for the other trainers on %s: %w", tc.Listen, err)
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
		rank, round, err = cl.Jobs().Join(wctx, tc.Job, tc.World, tc.Rank, l.Addr().String(), tables...)
		if err != nil {
			return nil, 0, 0, nil, fmt.Errorf("registering with job %s: %w", tc.Job, err)
		}
		fmt.Fprintf(progress, "trainer %d registered with job %s (round %d) at %s; waiting for %d trainers\n", rank, tc.Job, round, l.Addr(), tc.World)
		info, err := cl.Jobs().Wait(wctx, tc.Job, round)
		if errors.Is(err, client.ErrJobRoundChanged) {
			continue
		}
		if err != nil {
			return nil, 0, 0, nil, fmt.Errorf("waiting for the trainers of job %s: %w", tc.Job, err)
		}
		return info.Addrs, rank, round, l, nil
	}
}

// clientPS is the client as the training loop sees it: pulls at each
// table's own level.
type clientPS struct{ c *client.Client }

func (p clientPS) Pull(ctx context.Context, table string, keys []uint64, out []float32) error {
	return p.c.Pull(ctx, table, keys, out)
}

func (p clientPS) Push(ctx context.Context, table string, keys []uint64, grads []float32) error {
	return p.c.Push(ctx, table, keys, grads)
}

// RunLocal runs the n trainers of a synchronous job in this process, each
// with its own client of the cluster (cfg: addresses and credentials) and a collective group on
// loopback, and returns trainer 0's result (they end with the same dense
// parameters). Only trainer 0 reports progress and calls AfterStep.
func RunLocal(ctx context.Context, cfg client.Config, n int, tc JobConfig, out io.Writer) (*Result, error) {
	lns := make([]net.Listener, n)
	var peers []string
	for r := range lns {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		lns[r] = ln
		peers = append(peers, ln.Addr().String())
	}
	results := make([]*Result, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() {
			cl, err := client.New(cfg)
			if err != nil {
				errs[r] = err
				lns[r].Close()
				return
			}
			defer cl.Close()
			t := tc
			t.Rank, t.World, t.Peers, t.Listener = r, n, peers, lns[r]
			progress := out
			if r != 0 {
				t.AfterStep, progress = nil, nil // trainer 0 reports for the job
			}
			results[r], errs[r] = RunJob(ctx, cl, t, progress)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return results[0], nil
}

// reportEvals wraps after (which may be nil) to report each evaluation to
// the cluster, where the dashboard draws the job's curve. A report that
// fails costs a line of progress, not the job.
func reportEvals(cl *client.Client, job string, progress io.Writer, after func(int, *Eval)) func(int, *Eval) {
	return func(step int, e *Eval) {
		if e != nil {
			p := client.EvalPoint{Step: e.Step, Seconds: e.Seconds, AUC: e.AUC, LogLoss: e.LogLoss}
			if e.BayesAUC.Known() {
				p.BayesAUC, p.BayesLogLoss = float64(e.BayesAUC), float64(e.BayesLogLoss)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if err := cl.Jobs().ReportEval(ctx, job, p); err != nil {
				fmt.Fprintf(progress, "trainer 0: %v (the dashboard misses this point)\n", err)
			}
			cancel()
		}
		if after != nil {
			after(step, e)
		}
	}
}
