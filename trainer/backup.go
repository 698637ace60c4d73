package trainer

import (
	"context"
	"fmt"
	"time"
)

// QuorumPlan is how to join the collective.Quorum of a job with backup
// workers (collective.QuorumConfig's Initial, Steps and Update).
type QuorumPlan struct {
	// Initial is the quorum's state: the dense parameters to start from
	// (of the job's checkpoint, if any) followed by the number of steps
	// already done.
	Initial []float32
	// Steps is how many steps remain.
	Steps uint64
	// Update is trainer 0's dense SGD step on the mean of the accepted
	// gradients.
	Update func(step uint64, sum []float32, n int, state []float32)
}

// PlanQuorum reads the job's checkpoint (cfg.StateTable, if set) and
// returns how to join its quorum. Every trainer calls it before joining, so
// they agree on the steps that remain.
func PlanQuorum(ctx context.Context, cfg LoopConfig) (QuorumPlan, error) {
	cfg.Rank, cfg.World, cfg.Group, cfg.Quorum = 0, 1, nil, nil // the quorum is not formed yet
	cfg, err := cfg.withDefaults()
	if err != nil {
		return QuorumPlan{}, err
	}
	dense := cfg.Model.InitDense(cfg.Seed)
	done := 0
	if cfg.StateTable != "" {
		ck, ok, err := newJobState(cfg.PS, cfg.StateTable).readCheckpoint(ctx)
		if err != nil {
			return QuorumPlan{}, fmt.Errorf("trainer: resuming: %w", err)
		}
		if ok {
			if len(ck.Dense) != len(dense) {
				return QuorumPlan{}, fmt.Errorf("%w: the checkpoint holds %d dense parameters, model %T has %d: is the job name reused for another model?", ErrJobState, len(ck.Dense), cfg.Model, len(dense))
			}
			dense, done = ck.Dense, ck.Step
		}
	}
	if done >= cfg.Steps {
		return QuorumPlan{}, fmt.Errorf("%w: the job already finished step %d of %d: train for more steps or start another job", ErrJobState, done, cfg.Steps)
	}
	lr := cfg.DenseLR
	return QuorumPlan{
		Initial: append(dense, float32(done)),
		Steps:   uint64(cfg.Steps - done),
		Update: func(_ uint64, sum []float32, n int, state []float32) {
			scale := lr / float32(n)
			for i, g := range sum[:len(sum)-1] { // the last element is the step count
				state[i] -= float32(scale * g)
			}
		},
	}, nil
}

// backup is synchronous training with backup workers: trainer 0 keeps the
// dense parameters in the quorum; every step goes on with the first Need()
// gradients. A trainer whose gradient came too late pushes nothing for that
// step and goes on from the latest state, skipping the steps it missed
// (their samples are lost to it, as in Chen et al.).
func (r *run) backup(ctx context.Context) error {
	c := &r.cfg
	q := c.Quorum
	n := c.Model.DenseSize()
	state := make([]float32, n+1)
	qs, err := q.Next(ctx, state)
	if err != nil {
		return fmt.Errorf("trainer: receiving the starting point from trainer 0: %w", err)
	}
	offset := int(state[n])
	r.res.FirstStep = offset + 1
	version := 0
	if r.state != nil && c.Rank == 0 && offset > 0 {
		if ck, ok, err := r.state.readCheckpoint(ctx); err == nil && ok {
			version = ck.Version
		}
	}
	r.rowScale = 1 / float32(q.Need())
	grad := make([]float32, n+1)
	r.start = time.Now()
	for step := offset + int(qs); step <= c.Steps; {
		b := r.batchFor(step)
		t := time.Now()
		rows := r.rowsFor(b)
		if err := r.pull(ctx, b, rows); err != nil {
			return fmt.Errorf("trainer: step %d: pull: %w", step, err)
		}
		rowGrad, denseGrad, err := r.gradients(b, rows, state[:n])
		if err != nil {
			return fmt.Errorf("trainer: step %d: %w", step, err)
		}
		r.straggle(ctx, t)
		copy(grad, denseGrad)
		accepted, err := q.Submit(ctx, uint64(step-offset), grad)
		if err != nil {
			return fmt.Errorf("trainer: step %d: submitting the dense gradient: %w", step, err)
		}
		samples := 0
		if accepted {
			if err := r.push(ctx, b, rowGrad); err != nil {
				return fmt.Errorf("trainer: step %d: push: %w", step, err)
			}
			if err := q.Done(ctx, uint64(step-offset)); err != nil {
				return fmt.Errorf("trainer: step %d: %w", step, err)
			}
			samples = c.Batch
		} else {
			r.res.Late++
			r.cfg.Metrics.lateStep()
		}
		qs, err = q.Next(ctx, state)
		if err != nil {
			return fmt.Errorf("trainer: after step %d: %w", step, err)
		}
		// The state released is that after step next-1, whichever steps
		// this trainer took part in.
		next := offset + int(qs)
		if r.state != nil && c.Rank == 0 && ((next-1)%c.CheckpointEvery == 0 || next-1 == c.Steps) {
			if version, err = r.state.writeCheckpoint(ctx, version, next-1, state[:n]); err != nil {
				return fmt.Errorf("trainer: step %d: %w", next-1, err)
			}
		}
		r.res.Dense = state[:n]
		if err := r.finishStep(ctx, next-1, samples, state[:n]); err != nil {
			return err
		}
		step = next
	}
	return nil
}
