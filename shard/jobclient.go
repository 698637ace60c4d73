package shard

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/raftps/raftps/replication"
	"github.com/raftps/raftps/shard/shardpb"
)

// JobInfo is a trainer job's current round in the cluster's job registry.
type JobInfo struct {
	World int
	Round uint64
	// Addrs holds the trainers' collective addresses by rank; "" for a rank
	// not registered yet.
	Addrs []string
	// Complete: every rank of the round is registered.
	Complete bool
}

func jobInfo(resp *shardpb.GetJobResponse) JobInfo {
	j := resp.GetJob()
	info := JobInfo{World: int(j.GetWorld()), Round: j.GetRound(), Addrs: make([]string, j.GetWorld()), Complete: resp.GetComplete()}
	for _, m := range j.GetMembers() {
		if int(m.Rank) < len(info.Addrs) {
			info.Addrs[m.Rank] = m.Addr
		}
	}
	return info
}

// JoinJob registers the trainer listening at addr as one of world ranks of
// job, and returns its rank and the round it joined. rank -1 takes the
// lowest rank free when the join is applied. Joining again with the same
// addr while the round lasts returns the same rank, so a retry through a
// leader change is harmless. If the round is complete and addr is not in it,
// the join starts the next round with this trainer alone: the trainers of
// the old round see the round change (WaitJob) and join again. See jobs.go
// for the rules, ErrRankTaken and ErrWorldMismatch.
//
// Any node will do: a node that is not the metadata leader forwards the call.
func (c *Client) JoinJob(ctx context.Context, job string, world, rank int, addr string) (int, uint64, error) {
	if err := checkJoin(job, world, rank, addr); err != nil {
		return 0, 0, fmt.Errorf("raftps client: %w", err)
	}
	req := &shardpb.JoinJobRequest{Job: job, World: uint32(world), Rank: int32(rank), Addr: addr}
	var out *shardpb.JoinJobResponse
	err := c.callMeta(ctx, func(ctx context.Context, s shardpb.ParameterServerClient) (err error) {
		out, err = s.JoinJob(ctx, req)
		return err
	})
	if err != nil {
		return 0, 0, fmt.Errorf("joining job %q as %s: %w", job, addr, err)
	}
	return int(out.Rank), out.Round, nil
}

// GetJob returns the job's current round, as the metadata leader knows it:
// it includes every join acknowledged before the call. An error wrapping
// ErrUnknownJob if there is no such job.
func (c *Client) GetJob(ctx context.Context, job string) (JobInfo, error) {
	var out *shardpb.GetJobResponse
	err := c.callMeta(ctx, func(ctx context.Context, s shardpb.ParameterServerClient) (err error) {
		out, err = s.GetJob(ctx, &shardpb.GetJobRequest{Job: job})
		return err
	})
	if err != nil {
		return JobInfo{}, fmt.Errorf("getting job %q: %w", job, err)
	}
	return jobInfo(out), nil
}

// DeleteJob removes the job from the registry (its rank 0 does, once the job
// is done). An error wrapping ErrUnknownJob if there is no such job, unless
// an earlier attempt of this call may have deleted it.
func (c *Client) DeleteJob(ctx context.Context, job string) error {
	maybeDeleted := false
	err := c.callMeta(ctx, func(ctx context.Context, s shardpb.ParameterServerClient) error {
		_, err := s.DeleteJob(ctx, &shardpb.DeleteJobRequest{Job: job})
		if err == nil {
			return nil
		}
		rerr := fromStatus(err)
		if maybeDeleted && errors.Is(rerr, ErrUnknownJob) {
			return nil
		}
		// Only a NotLeader refusal proves the deletion was not committed.
		if !errors.Is(rerr, replication.ErrNotLeader) {
			maybeDeleted = true
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("deleting job %q: %w", job, err)
	}
	return nil
}

// WaitJob polls the job until round is complete and returns it. If the job
// has moved to another round meanwhile, it returns that round's JobInfo and
// an error wrapping ErrJobRoundChanged: the caller joins again. A job that
// was deleted is an error wrapping ErrUnknownJob. Only ctx bounds the wait.
func (c *Client) WaitJob(ctx context.Context, job string, round uint64) (JobInfo, error) {
	// Trainers of a job start within moments of each other, so the first
	// polls are quick; later ones back off so that many waiting trainers do
	// not load the metadata leader (each poll is a barrier there).
	const firstPoll, maxPoll = 20 * time.Millisecond, 200 * time.Millisecond
	wait := firstPoll
	for {
		info, err := c.GetJob(ctx, job)
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
