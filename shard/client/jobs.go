package client

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/raftps/raftps/shard/api"
	"github.com/raftps/raftps/shard/shardpb"
)

// Jobs is the cluster's trainer job registry: trainers of one job find each
// other's collective addresses through it, in rounds (a torch-elastic style
// rendezvous kept by the metadata group). Get it from Client.Jobs; it is
// safe for concurrent use.
type Jobs struct{ c *Client }

// Jobs returns the client's job registry API.
func (c *Client) Jobs() *Jobs { return &Jobs{c: c} }

// JobInfo is a trainer job's current round in the registry.
type JobInfo struct {
	Name  string `json:"name"`
	World int    `json:"world"`
	Round uint64 `json:"round"`
	// Addrs holds the trainers' collective addresses by rank; "" for a rank
	// not registered yet.
	Addrs []string `json:"addrs"`
	// Complete: every rank of the round is registered.
	Complete bool `json:"complete"`
}

func jobInfoOf(j *shardpb.Job) JobInfo {
	info := JobInfo{Name: j.GetName(), World: int(j.GetWorld()), Round: j.GetRound(), Addrs: make([]string, j.GetWorld())}
	for _, m := range j.GetMembers() {
		if int(m.Rank) < len(info.Addrs) {
			info.Addrs[m.Rank] = m.Addr
		}
	}
	info.Complete = len(j.GetMembers()) == int(j.GetWorld())
	return info
}

// Registered is how many ranks of the round are registered.
func (j JobInfo) Registered() int {
	n := 0
	for _, a := range j.Addrs {
		if a != "" {
			n++
		}
	}
	return n
}

// Join registers the trainer listening at addr as one of world ranks of
// job, and returns its rank and the round it joined. rank -1 takes the
// lowest rank free when the join is applied. Joining again with the same
// addr while the round lasts returns the same rank, so a retry through a
// leader change is harmless. If the round is complete and addr is not in
// it, the join starts the next round with this trainer alone: the trainers
// of the old round see the round change (Wait) and join again. A rank held
// by another address is ErrRankTaken; a world size other than the
// incomplete round's is ErrWorldMismatch.
//
// tables, if given, are the tables the job uses: while the job is in the
// registry, Tables.Drop refuses them (ErrTableInUse) unless forced. A join
// naming tables replaces the job's list.
//
// Any node will do: a node that is not the metadata leader forwards the call.
func (j *Jobs) Join(ctx context.Context, job string, world, rank int, addr string, tables ...string) (int, uint64, error) {
	if err := api.CheckJoin(job, world, rank, addr); err != nil {
		return 0, 0, fmt.Errorf("raftps client: %w", err)
	}
	req := &shardpb.JoinJobRequest{Job: job, World: uint32(world), Rank: int32(rank), Addr: addr, Tables: tables}
	var out *shardpb.JoinJobResponse
	err := j.c.callMeta(ctx, func(ctx context.Context, s shardpb.ParameterServerClient) (err error) {
		out, err = s.JoinJob(ctx, req)
		return err
	})
	if err != nil {
		return 0, 0, fmt.Errorf("joining job %q as %s: %w", job, addr, err)
	}
	return int(out.Rank), out.Round, nil
}

// Get returns the job's current round, as the metadata leader knows it: it
// includes every join acknowledged before the call. ErrUnknownJob if there
// is no such job.
func (j *Jobs) Get(ctx context.Context, job string) (JobInfo, error) {
	var out *shardpb.GetJobResponse
	err := j.c.callMeta(ctx, func(ctx context.Context, s shardpb.ParameterServerClient) (err error) {
		out, err = s.GetJob(ctx, &shardpb.GetJobRequest{Job: job})
		return err
	})
	if err != nil {
		return JobInfo{}, fmt.Errorf("getting job %q: %w", job, err)
	}
	return jobInfoOf(out.GetJob()), nil
}

// Delete removes the job from the registry (its rank 0 does, once the job
// is done). ErrUnknownJob if there is no such job, unless an earlier
// attempt of this call may have deleted it.
func (j *Jobs) Delete(ctx context.Context, job string) error {
	maybeDeleted := false
	err := j.c.callMeta(ctx, func(ctx context.Context, s shardpb.ParameterServerClient) error {
		_, err := s.DeleteJob(ctx, &shardpb.DeleteJobRequest{Job: job})
		if err == nil {
			return nil
		}
		rerr := api.FromStatus(err)
		if maybeDeleted && errors.Is(rerr, api.ErrUnknownJob) {
			return nil
		}
		// Only a NotLeader refusal proves the deletion was not committed.
		if !errors.Is(rerr, api.ErrNotLeader) {
			maybeDeleted = true
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("deleting job %q: %w", job, err)
	}
	return nil
}

// Wait polls the job until round is complete and returns it. If the job
// has moved to another round meanwhile, it returns that round's JobInfo and
// an error wrapping ErrJobRoundChanged: the caller joins again. A job that
// was deleted is an error wrapping ErrUnknownJob. Only ctx bounds the wait.
func (j *Jobs) Wait(ctx context.Context, job string, round uint64) (JobInfo, error) {
	// Trainers of a job start within moments of each other, so the first
	// polls are quick; later ones back off so that many waiting trainers do
	// not load the metadata leader (each poll is a barrier there).
	const firstPoll, maxPoll = 20 * time.Millisecond, 200 * time.Millisecond
	wait := firstPoll
	for {
		info, err := j.Get(ctx, job)
		switch {
		case err != nil:
			return JobInfo{}, fmt.Errorf("waiting for round %d: %w", round, err)
		case info.Round != round:
			return info, fmt.Errorf("job %q: %w: waiting for round %d, the job is at round %d", job, ErrJobRoundChanged, round, info.Round)
		case info.Complete:
			return info, nil
		}
		select {
		case <-ctx.Done():
			return info, fmt.Errorf("job %q: waiting for round %d to complete: %w", job, round, ctx.Err())
		case <-time.After(wait):
		}
		wait = min(2*wait, maxPoll)
	}
}

// EvalPoint is one evaluation of a job's model on its held-out set; the
// Bayes-optimal values are 0 where unknown (real data).
type EvalPoint struct {
	Step         int     `json:"step"`
	Seconds      float64 `json:"seconds"`
	AUC          float64 `json:"auc"`
	LogLoss      float64 `json:"logloss"`
	BayesAUC     float64 `json:"bayes_auc,omitempty"`
	BayesLogLoss float64 `json:"bayes_logloss,omitempty"`
}

// ReportEval records an evaluation of the job (its rank 0 reports each),
// which the dashboard draws. Reporting a step again replaces it and every
// later one (a resumed job), so a retried report changes nothing.
func (j *Jobs) ReportEval(ctx context.Context, job string, p EvalPoint) error {
	req := &shardpb.ReportEvalRequest{Job: job, Point: &shardpb.EvalPoint{Step: uint64(max(p.Step, 0)), Seconds: p.Seconds,
		Auc: p.AUC, Logloss: p.LogLoss, BayesAuc: p.BayesAUC, BayesLogloss: p.BayesLogLoss}}
	err := j.c.callMeta(ctx, func(ctx context.Context, s shardpb.ParameterServerClient) error {
		_, err := s.ReportEval(ctx, req)
		return err
	})
	if err != nil {
		return fmt.Errorf("reporting an evaluation of job %q: %w", job, err)
	}
	return nil
}
