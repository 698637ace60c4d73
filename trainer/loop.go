package trainer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/raftps/raftps/collective"
)

// ParamServer is where the embedding rows live: shard.Client in the product
// (the trainer is its only user here, so the interface is defined here).
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
	Data  *Synthetic
	// Batch samples per step and trainer (default 256); Steps per trainer
	// (default 1000).
	Batch int
	Steps int
	// DenseLR is the SGD step of the dense parameters (default 0.05).
	DenseLR float32
	// Group, if set, makes this one of Group.Size() synchronous trainers:
	// trainer r reads the samples of rank r of every step, and the dense
	// gradients are averaged by allreduce before every update, so every
	// trainer holds the same dense parameters. Nil: a single trainer.
	Group *collective.Group
	// Seed initialises the dense parameters (the same on every trainer).
	Seed uint64
	// EvalEvery steps (default Steps/5), the model is evaluated on
	// EvalSamples held-out samples (default 20000); Progress, if set, gets
	// a line per evaluation and per ProgressEvery steps (default 100).
	EvalEvery     int
	EvalSamples   int
	ProgressEvery int
	Progress      io.Writer
}

// Eval is one evaluation on the held-out samples.
type Eval struct {
	Step         int     `json:"step"`
	AUC          float64 `json:"auc"`
	LogLoss      float64 `json:"logloss"`
	BayesAUC     float64 `json:"bayes_auc"`
	BayesLogLoss float64 `json:"bayes_logloss"`
}

// Result is what Train did.
type Result struct {
	Steps       int     `json:"steps"`
	Samples     int     `json:"samples"`
	Seconds     float64 `json:"seconds"`
	SamplesPerS float64 `json:"samples_per_s"`
	Evals       []Eval  `json:"evals"`
	// Dense is the final dense parameter vector.
	Dense []float32 `json:"-"`
}

// heldOut is where the evaluation samples start: far from any training
// sample index (trainers read from 0 up).
const heldOut = 1 << 62

func (c LoopConfig) withDefaults() (LoopConfig, error) {
	if c.PS == nil || c.Model == nil || c.Data == nil || c.Table == "" {
		return c, errors.New("trainer: LoopConfig needs PS, Table, Model and Data")
	}
	if c.Batch == 0 {
		c.Batch = 256
	}
	if c.Steps == 0 {
		c.Steps = 1000
	}
	if c.DenseLR == 0 {
		c.DenseLR = 0.05
	}
	if c.EvalEvery == 0 {
		c.EvalEvery = max(1, c.Steps/5)
	}
	if c.EvalSamples == 0 {
		c.EvalSamples = 20000
	}
	if c.ProgressEvery == 0 {
		c.ProgressEvery = 100
	}
	if c.Batch < 1 || c.Steps < 1 || c.EvalSamples < 2 {
		return c, fmt.Errorf("trainer: Batch (%d), Steps (%d) must be positive and EvalSamples (%d) at least 2", c.Batch, c.Steps, c.EvalSamples)
	}
	return c, nil
}

// Train runs synchronous data-parallel training: every step each trainer
// pulls the rows of its batch, computes gradients, pushes the row gradients
// (the servers apply the table's optimizer) and, with a Group, averages the
// dense gradient with the other trainers before an SGD step. Train does not
// retry a pull or push itself: the client retries through leader changes,
// and only it can retry a push safely (with the same sequence numbers, so
// it is applied at most once); an error that reaches Train ends the run.
//
// Asynchronous and bounded-staleness modes, backup workers and checkpoints
// are not built yet.
func Train(ctx context.Context, cfg LoopConfig) (*Result, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	rank, world := 0, 1
	if cfg.Group != nil {
		rank, world = cfg.Group.Rank(), cfg.Group.Size()
	}
	dim := cfg.Model.Dim()
	dense := cfg.Model.InitDense(cfg.Seed)
	res := &Result{}
	evalSet := cfg.Data.Samples(heldOut, cfg.EvalSamples)
	bayesAUC, bayesLL := BayesMetrics(evalSet)
	start := time.Now()
	var rows []float32
	for step := 1; step <= cfg.Steps; step++ {
		first := uint64(((step-1)*world + rank) * cfg.Batch)
		b := NewBatch(cfg.Data.Samples(first, cfg.Batch))
		rows = growTo(rows, len(b.Keys)*dim)
		if err := cfg.PS.Pull(ctx, cfg.Table, b.Keys, rows); err != nil {
			return res, fmt.Errorf("trainer: step %d: pull: %w", step, err)
		}
		_, rowGrad, denseGrad, err := cfg.Model.Gradients(b, rows, dense)
		if err != nil {
			return res, fmt.Errorf("trainer: step %d: %w", step, err)
		}
		if world > 1 {
			// Each trainer's gradients are of the mean loss over its own
			// samples; the servers add the pushes of a step, so divide by
			// the number of trainers: a step is then one SGD step on the
			// mean over the global batch, as the allreduced dense step is.
			inv := 1 / float32(world)
			for i := range rowGrad {
				rowGrad[i] *= inv
			}
		}
		if err := cfg.PS.Push(ctx, cfg.Table, b.Keys, rowGrad); err != nil {
			return res, fmt.Errorf("trainer: step %d: push: %w", step, err)
		}
		if cfg.Group != nil {
			if err := cfg.Group.AllReduce(ctx, denseGrad, collective.Mean); err != nil {
				return res, fmt.Errorf("trainer: step %d: allreduce of the dense gradient: %w", step, err)
			}
		}
		for i, g := range denseGrad {
			dense[i] -= float32(cfg.DenseLR * g)
		}
		res.Steps, res.Samples = step, step*cfg.Batch
		if cfg.Progress != nil && step%cfg.ProgressEvery == 0 {
			fmt.Fprintf(cfg.Progress, "trainer %d: step %d/%d, %.0f samples/s\n", rank, step, cfg.Steps, float64(res.Samples)/time.Since(start).Seconds())
		}
		if step%cfg.EvalEvery == 0 || step == cfg.Steps {
			e, err := evaluateHeldOut(ctx, cfg, evalSet, dense)
			if err != nil {
				return res, fmt.Errorf("trainer: step %d: %w", step, err)
			}
			e.Step, e.BayesAUC, e.BayesLogLoss = step, bayesAUC, bayesLL
			res.Evals = append(res.Evals, e)
			if cfg.Progress != nil {
				fmt.Fprintf(cfg.Progress, "trainer %d: step %d: eval AUC %.4f logloss %.4f (Bayes-optimal %.4f / %.4f)\n", rank, step, e.AUC, e.LogLoss, bayesAUC, bayesLL)
			}
		}
	}
	res.Seconds = time.Since(start).Seconds()
	res.SamplesPerS = float64(res.Samples) / res.Seconds
	res.Dense = dense
	return res, nil
}

// evaluateHeldOut predicts the held-out samples in batches of 4096 and
// scores them.
func evaluateHeldOut(ctx context.Context, cfg LoopConfig, set []Sample, dense []float32) (Eval, error) {
	labels := make([]float32, 0, len(set))
	probs := make([]float64, 0, len(set))
	var rows []float32
	for lo := 0; lo < len(set); lo += 4096 {
		b := NewBatch(set[lo:min(lo+4096, len(set))])
		rows = growTo(rows, len(b.Keys)*cfg.Model.Dim())
		if err := cfg.PS.Pull(ctx, cfg.Table, b.Keys, rows); err != nil {
			return Eval{}, fmt.Errorf("evaluation pull: %w", err)
		}
		p, err := cfg.Model.Predict(b, rows, dense)
		if err != nil {
			return Eval{}, err
		}
		probs = append(probs, p...)
		labels = append(labels, b.Labels()...)
	}
	return Eval{AUC: AUC(labels, probs), LogLoss: LogLoss(labels, probs)}, nil
}

func growTo(s []float32, n int) []float32 {
	if cap(s) < n {
		return make([]float32, n)
	}
	return s[:n]
}
