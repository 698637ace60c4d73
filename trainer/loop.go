package trainer

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/raftps/raftps/collective"
)

// ParamServer is where the embedding rows live: a raftps cluster through
// its client in the product (RunJob adapts it), a plain store in tests.
// The training loop is its only user, so the interface is defined here.
type ParamServer interface {
	Pull(ctx context.Context, table string, keys []uint64, out []float32) error
	Push(ctx context.Context, table string, keys []uint64, grads []float32) error
}

// LoopConfig configures Train. Zero fields get the defaults noted.
type LoopConfig struct {
	// PS holds the embedding table Table, of dimension Model.Dim(); its
	// optimizer (set at table create) applies the pushed row gradients.
	PS    ParamServer
	Table string
	Model Model
	// Data is read by step and rank: trainer r of W reads samples
	// ((t-1)*W + r)*Batch onwards at step t, so a job reads the same
	// samples whatever its mode and however often it was restarted.
	Data Dataset
	// Eval is the held-out set. Nil with a *Synthetic Data means
	// EvalSamples samples far beyond any training index.
	Eval []Sample
	// Batch samples per step and trainer (default 256); Steps per trainer
	// (default 1000).
	Batch int
	Steps int
	// DenseLR is the SGD step of the dense parameters (default 0.05).
	DenseLR float32
	// Mode is sync (the default), async or ssp:S.
	Mode Mode
	// Group makes this one of Group.Size() synchronous trainers whose dense
	// gradients are averaged by allreduce. Nil: a single trainer, or
	// Quorum.
	Group *collective.Group
	// Quorum (a *collective.Quorum) makes this one of the synchronous
	// trainers of a job with backup workers: each step goes on with the
	// first Quorum.Need() trainers' gradients and discards the others
	// (sync mode only).
	Quorum Quorum
	// Rank and World place this trainer in an asynchronous or SSP job
	// (sync trainers take them from Group or Quorum). Default 0 and 1.
	Rank, World int
	// StateTable and DenseTable are the job's tables (see StateDim). Async
	// and SSP need both; sync uses StateTable, if set, for checkpoints.
	StateTable, DenseTable string
	// CheckpointEvery is how often (in steps) trainer 0 of a sync job
	// stores the dense parameters in StateTable; it also does after the
	// last step. Default 100. A sync job that finds a checkpoint resumes
	// after its step. Async and SSP trainers need no checkpoint: the dense
	// parameters live in DenseTable and each trainer resumes after its own
	// clock.
	CheckpointEvery int
	// Slowdown > 1 makes this trainer that many times slower, for straggler
	// experiments: after each step's work it sleeps Slowdown-1 times as long
	// as the work took.
	Slowdown float64
	// Seed initialises the dense parameters (the same on every trainer).
	Seed uint64
	// Trainer 0 evaluates the model every EvalEvery steps (default
	// Steps/5) and after the last, on EvalSamples held-out samples (default
	// 20000). Progress, if set, gets a line per evaluation and per
	// ProgressEvery steps (default Steps/10).
	EvalEvery     int
	EvalSamples   int
	ProgressEvery int
	Progress      io.Writer
	// AfterStep, if set, is called on Train's goroutine after every step
	// this trainer finished, with the evaluation taken after it, if any.
	AfterStep func(step int, e *Eval)
	// Metrics, if set, records steps, latencies and evaluations.
	Metrics *Metrics
}

// Quorum is what Train needs of a *collective.Quorum: trainer 0 keeps the
// dense parameters and releases step after step; each step takes the first
// Need() dense gradients submitted to it.
type Quorum interface {
	Rank() int
	Size() int
	Need() int
	// Next waits for the next step released after the last one this
	// trainer saw and copies the dense parameters it starts from.
	Next(ctx context.Context, state []float32) (step uint64, err error)
	// Submit offers the dense gradient of step; accepted is false if the
	// step already had its Need() gradients or is over.
	Submit(ctx context.Context, step uint64, grad []float32) (accepted bool, err error)
	// Done reports that an accepted trainer's pushes of step are applied.
	Done(ctx context.Context, step uint64) error
}

// Optional is a value that may be unknown (NaN); it is null in JSON.
type Optional float64

// MarshalJSON writes null for NaN and infinities, which JSON cannot hold.
func (o Optional) MarshalJSON() ([]byte, error) {
	if math.IsNaN(float64(o)) || math.IsInf(float64(o), 0) {
		return []byte("null"), nil
	}
	return json.Marshal(float64(o))
}

// UnmarshalJSON reads what MarshalJSON writes: null as NaN.
func (o *Optional) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*o = Optional(math.NaN())
		return nil
	}
	var f float64
	if err := json.Unmarshal(b, &f); err != nil {
		return err
	}
	*o = Optional(f)
	return nil
}

// Known reports whether the value is known (not NaN).
func (o Optional) Known() bool { return !math.IsNaN(float64(o)) }

// Eval is one evaluation on the held-out samples.
type Eval struct {
	Step int `json:"step"`
	// Seconds is the training time when it was taken, evaluations excluded.
	Seconds float64 `json:"seconds"`
	AUC     float64 `json:"auc"`
	LogLoss float64 `json:"logloss"`
	// The Bayes-optimal values are known for synthetic data only.
	BayesAUC     Optional `json:"bayes_auc"`
	BayesLogLoss Optional `json:"bayes_logloss"`
}

// Latency summarises the durations of one kind of request, in milliseconds.
type Latency struct {
	N    int     `json:"n"`
	Mean float64 `json:"mean_ms"`
	P50  float64 `json:"p50_ms"`
	P99  float64 `json:"p99_ms"`
}

func summarise(d []time.Duration) Latency {
	if len(d) == 0 {
		return Latency{}
	}
	s := slices.Clone(d)
	slices.Sort(s)
	var sum time.Duration
	for _, x := range s {
		sum += x
	}
	ms := func(x time.Duration) float64 { return float64(x) / 1e6 }
	return Latency{N: len(s), Mean: ms(sum) / float64(len(s)), P50: ms(s[len(s)/2]), P99: ms(s[(len(s)*99)/100])}
}

// Result is what Train did.
type Result struct {
	Rank  int    `json:"rank"`
	World int    `json:"world"`
	Mode  string `json:"mode"`
	// FirstStep is 1, or the step a resumed job went on from.
	FirstStep int `json:"first_step"`
	// Steps is the last step finished; Samples the samples this trainer's
	// accepted gradients came from.
	Steps   int `json:"steps"`
	Samples int `json:"samples"`
	// Late counts the steps whose gradients this trainer computed too late
	// to be used (backup workers only).
	Late int `json:"late"`
	// Seconds is the wall time of the loop less evaluations.
	Seconds     float64 `json:"seconds"`
	SamplesPerS float64 `json:"samples_per_s"`
	Pull        Latency `json:"pull"`
	Push        Latency `json:"push"`
	// Evals are trainer 0's evaluations.
	Evals []Eval `json:"evals"`
	// Dense is the final dense parameter vector.
	Dense []float32 `json:"-"`
}

// HeldOut is where the synthetic evaluation samples start: far from any
// training sample index (trainers read from 0 up).
const HeldOut = 1 << 62

func (c LoopConfig) withDefaults() (LoopConfig, error) {
	if c.PS == nil || c.Model == nil || c.Data == nil || c.Table == "" {
		return c, errors.New("trainer: LoopConfig needs PS, Table, Model and Data")
	}
	c.Batch = cmp.Or(c.Batch, 256)
	c.Steps = cmp.Or(c.Steps, 1000)
	if c.DenseLR == 0 {
		c.DenseLR = 0.05
	}
	c.EvalEvery = cmp.Or(c.EvalEvery, max(1, c.Steps/5))
	c.EvalSamples = cmp.Or(c.EvalSamples, 20000)
	c.ProgressEvery = cmp.Or(c.ProgressEvery, max(1, c.Steps/10))
	c.CheckpointEvery = cmp.Or(c.CheckpointEvery, 100)
	c.World = cmp.Or(c.World, 1)
	switch {
	case c.Batch < 1 || c.Steps < 1 || c.Steps >= MaxSteps || c.EvalSamples < 2:
		return c, fmt.Errorf("trainer: Batch (%d) must be positive, Steps (%d) in [1, %d) and EvalSamples (%d) at least 2", c.Batch, c.Steps, MaxSteps, c.EvalSamples)
	case math.IsNaN(float64(c.DenseLR)) || math.IsInf(float64(c.DenseLR), 0) || c.DenseLR < 0:
		return c, fmt.Errorf("trainer: DenseLR %v: want a finite positive step", c.DenseLR)
	case c.Slowdown != 0 && !(c.Slowdown >= 1 && c.Slowdown <= 1000):
		return c, fmt.Errorf("trainer: Slowdown %v: want a factor from 1 to 1000", c.Slowdown)
	case c.Group != nil && c.Quorum != nil:
		return c, errors.New("trainer: Group and Quorum are exclusive")
	case c.Mode.Kind != Sync && (c.Group != nil || c.Quorum != nil):
		return c, fmt.Errorf("trainer: mode %s takes Rank and World, not a collective group", c.Mode)
	case c.Mode.Kind == Sync && c.World > 1 && c.Group == nil && c.Quorum == nil:
		return c, fmt.Errorf("trainer: %d synchronous trainers need a Group or a Quorum", c.World)
	case c.Mode.Kind != Sync && (c.StateTable == "" || c.DenseTable == ""):
		return c, fmt.Errorf("trainer: mode %s keeps the job's clocks and dense parameters in the cluster: set StateTable and DenseTable", c.Mode)
	case c.Rank < 0 || c.Rank >= c.World:
		return c, fmt.Errorf("trainer: Rank %d outside [0, World=%d)", c.Rank, c.World)
	}
	switch {
	case c.Group != nil:
		c.Rank, c.World = c.Group.Rank(), c.Group.Size()
	case c.Quorum != nil:
		c.Rank, c.World = c.Quorum.Rank(), c.Quorum.Size()
	}
	if c.Eval == nil {
		s, ok := c.Data.(*Synthetic)
		if !ok {
			return c, errors.New("trainer: Eval is needed unless Data is *Synthetic")
		}
		c.Eval = s.Samples(HeldOut, c.EvalSamples)
	}
	return c, nil
}

// Train runs data-parallel training in cfg.Mode: each step a trainer pulls
// the rows of its batch, computes gradients, pushes the row gradients (the
// table's optimizer applies them on the servers) and updates the dense
// parameters: averaged by allreduce (sync), through a quorum with backup
// workers, or through the job's dense table (async, SSP).
//
// Gradients of every trainer are divided by the number of trainers, so one
// step of W trainers moves the model as far as one step of one trainer on W
// times the batch. Train does not retry a pull or push itself: the client
// retries through leader changes, and only it can retry a push safely (with
// the same sequence numbers, so it is applied at most once); an error that
// reaches Train ends the run, and a job restarted under the same tables
// resumes (see LoopConfig.CheckpointEvery).
func Train(ctx context.Context, cfg LoopConfig) (*Result, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	r := &run{cfg: cfg, res: &Result{Rank: cfg.Rank, World: cfg.World, Mode: cfg.Mode.String()}, rowScale: 1 / float32(cfg.World)}
	if cfg.Quorum != nil {
		r.res.Mode += fmt.Sprintf(" with %d backup workers", cfg.World-cfg.Quorum.Need())
	}
	if cfg.StateTable != "" {
		r.state = newJobState(cfg.PS, cfg.StateTable)
	}
	if cfg.Rank == 0 {
		r.bayesAUC, r.bayesLL = math.NaN(), math.NaN()
		if knownProbs(cfg.Eval) {
			a, l := BayesMetrics(cfg.Eval)
			r.bayesAUC, r.bayesLL = a, l
		}
	}
	switch {
	case cfg.Mode.Kind != Sync:
		err = r.async(ctx)
	case cfg.Quorum != nil:
		err = r.backup(ctx)
	default:
		err = r.sync(ctx)
	}
	res := r.res
	res.Seconds = r.trainSeconds()
	if res.Seconds > 0 {
		res.SamplesPerS = float64(res.Samples) / res.Seconds
	}
	res.Pull, res.Push = summarise(r.pulls), summarise(r.pushes)
	return res, err
}

// run is one Train call's state.
type run struct {
	cfg   LoopConfig
	res   *Result
	state *jobState

	start     time.Time
	evalTime  time.Duration
	bayesAUC  float64
	bayesLL   float64
	pulls     []time.Duration
	pushes    []time.Duration
	rowScale  float32 // 1/World, or 1/Need with backup workers
	batchRows []float32
}

func (r *run) trainSeconds() float64 {
	if r.start.IsZero() {
		return 0
	}
	return (time.Since(r.start) - r.evalTime).Seconds()
}

func knownProbs(set []Sample) bool {
	for i := range set {
		if math.IsNaN(set[i].Prob) {
			return false
		}
	}
	return len(set) > 0
}

// batchFor returns trainer rank's batch of step.
func (r *run) batchFor(step int) *Batch {
	c := &r.cfg
	first := uint64(((step-1)*c.World + c.Rank) * c.Batch)
	return NewBatch(c.Data.Samples(first, c.Batch))
}

// batches prepares the batches of steps from..to in a goroutine, two ahead,
// so generating samples and deduplicating keys overlaps the current step.
func (r *run) batches(ctx context.Context, from, to int) <-chan *Batch {
	ch := make(chan *Batch, 2)
	go func() {
		defer close(ch)
		for s := from; s <= to; s++ {
			select {
			case ch <- r.batchFor(s):
			case <-ctx.Done():
				return
			}
		}
	}()
	return ch
}

// pull reads the rows of b and records the latency.
func (r *run) pull(ctx context.Context, b *Batch, rows []float32) error {
	t := time.Now()
	err := r.cfg.PS.Pull(ctx, r.cfg.Table, b.Keys, rows)
	r.pulls = append(r.pulls, time.Since(t))
	r.cfg.Metrics.pulled(time.Since(t))
	return err
}

// gradients runs forward and backward and scales the row gradients by
// 1/World; the caller scales the dense one as its mode needs.
func (r *run) gradients(b *Batch, rows, dense []float32) (rowGrad, denseGrad []float32, err error) {
	_, rowGrad, denseGrad, err = r.cfg.Model.Gradients(b, rows, dense)
	if err != nil {
		return nil, nil, err
	}
	if r.rowScale != 1 {
		// The servers add the pushes of every trainer (of every accepted
		// one, with backup workers).
		for i := range rowGrad {
			rowGrad[i] *= r.rowScale
		}
	}
	return rowGrad, denseGrad, nil
}

func (r *run) push(ctx context.Context, b *Batch, rowGrad []float32) error {
	t := time.Now()
	err := r.cfg.PS.Push(ctx, r.cfg.Table, b.Keys, rowGrad)
	r.pushes = append(r.pushes, time.Since(t))
	r.cfg.Metrics.pushed(time.Since(t))
	return err
}

// straggle sleeps Slowdown-1 times the step's own work since t (its pull,
// gradients and push; not its waits for other trainers), so a slowed
// trainer's steps take Slowdown times as long.
func (r *run) straggle(ctx context.Context, t time.Time) {
	if r.cfg.Slowdown <= 1 {
		return
	}
	d := time.Duration(float64(time.Since(t)) * (r.cfg.Slowdown - 1))
	select {
	case <-time.After(d):
	case <-ctx.Done():
	}
}

// finishStep records a finished step and prints progress and evaluations.
// dense is the trainer's dense parameters after the step; for async
// trainers evalDense fetches the current ones instead.
func (r *run) finishStep(ctx context.Context, step, samples int, dense []float32) error {
	c := &r.cfg
	r.res.Steps = step
	r.res.Samples += samples
	c.Metrics.step(samples)
	if c.Progress != nil && step%c.ProgressEvery == 0 {
		fmt.Fprintf(c.Progress, "trainer %d: step %d/%d, %.0f samples/s\n", c.Rank, step, c.Steps, float64(r.res.Samples)/r.trainSeconds())
	}
	if c.Rank != 0 || (step%c.EvalEvery != 0 && step != c.Steps) {
		if c.AfterStep != nil {
			c.AfterStep(step, nil)
		}
		return nil
	}
	t := time.Now()
	defer func() { r.evalTime += time.Since(t) }()
	e, err := r.evaluate(ctx, dense)
	if err != nil {
		return fmt.Errorf("trainer: step %d: %w", step, err)
	}
	e.Step, e.Seconds = step, r.trainSeconds()
	r.res.Evals = append(r.res.Evals, e)
	c.Metrics.eval(e)
	if c.Progress != nil {
		fmt.Fprintf(c.Progress, "trainer %d: step %d: eval AUC %.4f logloss %.4f (Bayes-optimal %.4f / %.4f)\n", c.Rank, step, e.AUC, e.LogLoss, r.bayesAUC, r.bayesLL)
	}
	if c.AfterStep != nil {
		c.AfterStep(step, &e)
	}
	return nil
}

// evaluate predicts the held-out samples in batches of 4096 and scores them.
func (r *run) evaluate(ctx context.Context, dense []float32) (Eval, error) {
	c := &r.cfg
	labels := make([]float32, 0, len(c.Eval))
	probs := make([]float64, 0, len(c.Eval))
	var rows []float32
	for lo := 0; lo < len(c.Eval); lo += 4096 {
		b := NewBatch(c.Eval[lo:min(lo+4096, len(c.Eval))])
		rows = growTo(rows, len(b.Keys)*c.Model.Dim())
		if err := c.PS.Pull(ctx, c.Table, b.Keys, rows); err != nil {
			return Eval{}, fmt.Errorf("evaluation pull: %w", err)
		}
		p, err := c.Model.Predict(b, rows, dense)
		if err != nil {
			return Eval{}, err
		}
		probs = append(probs, p...)
		labels = append(labels, b.Labels()...)
	}
	return Eval{AUC: AUC(labels, probs), LogLoss: LogLoss(labels, probs), BayesAUC: Optional(r.bayesAUC), BayesLogLoss: Optional(r.bayesLL)}, nil
}

// sync is synchronous training, with an allreduce group or alone.
func (r *run) sync(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	c := &r.cfg
	dense := c.Model.InitDense(c.Seed)
	first, version := 1, 0
	if r.state != nil && c.Rank == 0 {
		ck, ok, err := r.state.readCheckpoint(ctx)
		if err != nil {
			return fmt.Errorf("trainer: resuming: %w", err)
		}
		if ok {
			if len(ck.Dense) != len(dense) {
				return fmt.Errorf("%w: the checkpoint holds %d dense parameters, model %T has %d: is the job name reused for another model?", ErrJobState, len(ck.Dense), c.Model, len(dense))
			}
			dense, first, version = ck.Dense, ck.Step+1, ck.Version
			if c.Progress != nil {
				fmt.Fprintf(c.Progress, "trainer 0: resuming from the checkpoint after step %d\n", ck.Step)
			}
		}
	}
	if c.Group != nil {
		// Every trainer starts from trainer 0's step and parameters.
		buf := append(slices.Clone(dense), float32(first))
		if err := c.Group.Broadcast(ctx, buf, 0); err != nil {
			return fmt.Errorf("trainer: receiving the starting point from trainer 0: %w", err)
		}
		copy(dense, buf)
		first = int(buf[len(buf)-1])
	}
	r.res.FirstStep = first
	if first > c.Steps {
		return fmt.Errorf("%w: the job already finished step %d of %d: train for more steps or start another job", ErrJobState, first-1, c.Steps)
	}
	r.start = time.Now()
	bs := r.batches(ctx, first, c.Steps)
	for step := first; step <= c.Steps; step++ {
		b, ok := <-bs
		if !ok {
			return ctx.Err()
		}
		t := time.Now()
		rows := r.rowsFor(b)
		if err := r.pull(ctx, b, rows); err != nil {
			return fmt.Errorf("trainer: step %d: pull: %w", step, err)
		}
		rowGrad, denseGrad, err := r.gradients(b, rows, dense)
		if err != nil {
			return fmt.Errorf("trainer: step %d: %w", step, err)
		}
		// The push must be acknowledged before the allreduce: the
		// allreduce is the step's barrier, after which any trainer may
		// pull for the next step and must see every push of this one.
		if err := r.push(ctx, b, rowGrad); err != nil {
			return fmt.Errorf("trainer: step %d: push: %w", step, err)
		}
		r.straggle(ctx, t)
		if c.Group != nil {
			ar := time.Now()
			if err := c.Group.AllReduce(ctx, denseGrad, collective.Mean); err != nil {
				return fmt.Errorf("trainer: step %d: allreduce of the dense gradient: %w", step, err)
			}
			c.Metrics.allreduced(time.Since(ar))
		}
		for i, g := range denseGrad {
			dense[i] -= float32(c.DenseLR * g)
		}
		if r.state != nil && c.Rank == 0 && (step%c.CheckpointEvery == 0 || step == c.Steps) {
			if version, err = r.state.writeCheckpoint(ctx, version, step, dense); err != nil {
				return fmt.Errorf("trainer: step %d: %w", step, err)
			}
		}
		r.res.Dense = dense
		if err := r.finishStep(ctx, step, c.Batch, dense); err != nil {
			return err
		}
	}
	return nil
}

func (r *run) rowsFor(b *Batch) []float32 {
	r.batchRows = growTo(r.batchRows, len(b.Keys)*r.cfg.Model.Dim())
	return r.batchRows
}

// async is asynchronous and SSP training against the job's dense table.
func (r *run) async(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	c := &r.cfg
	n := c.Model.DenseSize()
	dt := newDenseTable(c.PS, c.DenseTable, n)
	if err := r.state.initDense(ctx, c.Rank, dt, c.Model.InitDense(c.Seed), 5*time.Millisecond); err != nil {
		return fmt.Errorf("trainer: %w", err)
	}
	clocks, err := r.state.clocks(ctx, c.World)
	if err != nil {
		return fmt.Errorf("trainer: %w", err)
	}
	first := clocks[c.Rank] + 1
	r.res.FirstStep = first
	if first > c.Steps {
		return fmt.Errorf("%w: trainer %d already finished step %d of %d: train for more steps or start another job", ErrJobState, c.Rank, first-1, c.Steps)
	}
	if first > 1 && c.Progress != nil {
		fmt.Fprintf(c.Progress, "trainer %d: resuming after step %d, its clock in the job's state table\n", c.Rank, first-1)
	}
	slowest := slices.Min(clocks)
	r.start = time.Now()
	bs := r.batches(ctx, first, c.Steps)

	// A fetch is the rows of one batch and the dense parameters, pulled
	// together. Async prefetches the next step's while it computes; SSP
	// cannot, as a trainer must read its own pushes of the step before.
	type fetch struct {
		b     *Batch
		rows  []float32
		dense []float32
		took  time.Duration
		err   error
	}
	get := func(b *Batch) fetch {
		f := fetch{b: b, rows: make([]float32, len(b.Keys)*c.Model.Dim()), dense: make([]float32, n)}
		var wg sync.WaitGroup
		var derr error
		wg.Go(func() { derr = dt.pull(ctx, f.dense) })
		t := time.Now()
		f.err = c.PS.Pull(ctx, c.Table, b.Keys, f.rows)
		f.took = time.Since(t)
		wg.Wait()
		f.err = errors.Join(f.err, derr)
		return f
	}
	// A prefetch still running when the loop returns early is cancelled
	// and waited for, so that it ends with Train.
	var next chan fetch
	defer func() {
		cancel()
		if next != nil {
			<-next
		}
	}()
	step := make([]float32, n)
	for s := first; s <= c.Steps; s++ {
		if c.Mode.Kind == SSP && slowest < s-1-c.Mode.Staleness {
			if slowest, err = r.waitClocks(ctx, s-1-c.Mode.Staleness); err != nil {
				return fmt.Errorf("trainer: step %d: %w", s, err)
			}
		}
		t := time.Now()
		var f fetch
		if next != nil {
			f = <-next
			next = nil
		} else {
			b, ok := <-bs
			if !ok {
				return ctx.Err()
			}
			f = get(b)
		}
		r.pulls = append(r.pulls, f.took)
		if f.err != nil {
			return fmt.Errorf("trainer: step %d: pull: %w", s, f.err)
		}
		if c.Mode.Kind == Async && s < c.Steps {
			b, ok := <-bs
			if !ok {
				return ctx.Err()
			}
			next = make(chan fetch, 1)
			go func() { next <- get(b) }()
		}
		rowGrad, denseGrad, err := r.gradients(f.b, f.rows, f.dense)
		if err != nil {
			return fmt.Errorf("trainer: step %d: %w", s, err)
		}
		scale := c.DenseLR / float32(c.World)
		for i, g := range denseGrad {
			step[i] = float32(scale * g)
		}
		// SSP's clock promises that the step's pushes are applied, so it
		// follows them; an async clock only tells a restarted trainer
		// where to resume, and goes with them (if the pushes fail the run
		// ends, and at worst a resumed trainer skips that one batch).
		var wg sync.WaitGroup
		var derr, cerr error
		wg.Go(func() { derr = dt.push(ctx, step) })
		if c.Mode.Kind == Async {
			wg.Go(func() { cerr = r.state.setClock(ctx, c.Rank, s) })
		}
		perr := r.push(ctx, f.b, rowGrad)
		wg.Wait()
		if err := errors.Join(perr, derr); err != nil {
			return fmt.Errorf("trainer: step %d: push: %w", s, err)
		}
		if c.Mode.Kind == SSP {
			cerr = r.state.setClock(ctx, c.Rank, s)
		}
		if cerr != nil {
			return fmt.Errorf("trainer: step %d: %w", s, cerr)
		}
		r.straggle(ctx, t)
		// The dense parameters after this trainer's step: what it pulled
		// less its own step (others' steps since are not in it).
		for i := range f.dense {
			f.dense[i] -= step[i]
		}
		r.res.Dense = f.dense
		if err := r.finishStep(ctx, s, c.Batch, f.dense); err != nil {
			return err
		}
	}
	return nil
}

// waitClocks waits until every trainer has finished step want and returns
// the slowest trainer's clock. It polls the clocks, backing off from 1 ms
// to 20 ms.
func (r *run) waitClocks(ctx context.Context, want int) (int, error) {
	wait := time.Millisecond
	for {
		clocks, err := r.state.clocks(ctx, r.cfg.World)
		if err != nil {
			return 0, err
		}
		if m := slices.Min(clocks); m >= want {
			return m, nil
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("waiting for every trainer to finish step %d: %w", want, ctx.Err())
		case <-time.After(wait):
		}
		wait = min(2*wait, 20*time.Millisecond)
	}
}

func growTo(s []float32, n int) []float32 {
	if cap(s) < n {
		return make([]float32, n)
	}
	return s[:n]
}
