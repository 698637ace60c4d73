package test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/raftps/raftps/shard/client"
	"github.com/raftps/raftps/shard/shardpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// metaLeader returns the index of the node leading the metadata group.
func metaLeader(t *testing.T, c *Cluster) int {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		for i := range c.Addrs() {
			if n := c.Node(i); n != nil && n.MetaRaft().State().String() == "Leader" {
				return i
			}
		}
	}
	t.Fatal("no metadata leader")
	return -1
}

// TestJobRendezvous: trainers find each other through the job registry.
// Three trainers, each with a client that knows one node only, register
// concurrently and each learns every address by rank; a node that is not the
// metadata leader serves the registry by forwarding. A fourth address joining
// the complete round starts round 2, and a trainer still waiting for round 1
// learns the round changed. The registry is replicated: after the metadata
// leader's node is stopped, round 2 is still there and fills up. DeleteJob
// removes the job.
func TestJobRendezvous(t *testing.T) {
	waitsMostly(t)
	c := StartCluster(t, 3, FastRaft())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	clients := make([]*client.Client, 3)
	for i, addr := range c.Addrs() {
		clients[i] = c.ClientWith(func(cfg *client.Config) { cfg.Addrs = []string{addr} })
	}
	trainer := func(i int) string { return fmt.Sprintf("10.0.0.%d:7950", i+1) }

	// Round 1: three trainers through three different nodes.
	type joined struct {
		rank  int
		round uint64
		info  client.JobInfo
	}
	got := make([]joined, 3)
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Go(func() {
			rank, round, err := clients[i].Jobs().Join(ctx, "job", 3, -1, trainer(i))
			if err != nil {
				t.Errorf("trainer %d: %v", i, err)
				return
			}
			info, err := clients[i].Jobs().Wait(ctx, "job", round)
			if err != nil {
				t.Errorf("trainer %d: waiting for round %d: %v", i, round, err)
				return
			}
			got[i] = joined{rank, round, info}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	var ranks []int
	for i, g := range got {
		if g.round != 1 || !g.info.Complete || g.info.Round != 1 || g.info.World != 3 {
			t.Fatalf("trainer %d: round %d, job %+v; want round 1, complete, world 3", i, g.round, g.info)
		}
		if !slices.Equal(g.info.Addrs, got[0].info.Addrs) {
			t.Fatalf("trainers see different rounds: %v and %v", g.info.Addrs, got[0].info.Addrs)
		}
		if g.info.Addrs[g.rank] != trainer(i) {
			t.Fatalf("trainer %d has rank %d, but the job has %q there: %v", i, g.rank, g.info.Addrs[g.rank], g.info.Addrs)
		}
		ranks = append(ranks, g.rank)
	}
	if slices.Sort(ranks); !slices.Equal(ranks, []int{0, 1, 2}) {
		t.Fatalf("ranks %v, want 0, 1, 2", ranks)
	}

	// A metadata follower answers a plain call itself, forwarding it: no
	// redirect for the caller to follow.
	f := metaFollower(t, c)
	stub := c.RawStub(c.Addrs()[f])
	var resp *shardpb.GetJobResponse
	var err error
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		// A follower that has not heard of the leader yet refuses; retry.
		resp, err = stub.GetJob(ctx, &shardpb.GetJobRequest{Job: "job"})
		if code := status.Code(err); (code != codes.FailedPrecondition && code != codes.Unavailable) || time.Now().After(deadline) {
			break
		}
	}
	if err != nil || resp.Job.Round != 1 || len(resp.Job.Members) != 3 || !resp.Complete {
		t.Fatalf("GetJob on metadata follower n%d: %v, %v", f+1, resp, err)
	}
	// Errors keep their meaning through the forward.
	if _, err := stub.JoinJob(ctx, &shardpb.JoinJobRequest{Job: "other", World: 2, Rank: 1, Addr: "x:1"}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := clients[f].Jobs().Join(ctx, "other", 2, 1, "y:1"); !errors.Is(err, client.ErrRankTaken) {
		t.Fatalf("a taken rank through a follower: %v, want ErrRankTaken", err)
	}
	if _, _, err := clients[f].Jobs().Join(ctx, "other", 3, -1, "y:1"); !errors.Is(err, client.ErrWorldMismatch) {
		t.Fatalf("another world size through a follower: %v, want ErrWorldMismatch", err)
	}

	// A new trainer joins the complete round: round 2 starts with it alone.
	rank, round, err := clients[2].Jobs().Join(ctx, "job", 3, -1, trainer(3))
	if err != nil || rank != 0 || round != 2 {
		t.Fatalf("a fourth address joining a complete round: rank %d round %d, %v; want rank 0 of round 2", rank, round, err)
	}
	info, err := clients[0].Jobs().Wait(ctx, "job", 1)
	if !errors.Is(err, client.ErrJobRoundChanged) || info.Round != 2 {
		t.Fatalf("waiting for round 1 after round 2 began: %+v, %v; want ErrJobRoundChanged and round 2", info, err)
	}

	// Stop the metadata leader's node: the registry lives on the others.
	l := metaLeader(t, c)
	c.Kill(l)
	live := clients[(l+1)%3]
	info, err = live.Jobs().Get(ctx, "job")
	if err != nil || info.Round != 2 || info.Complete || !slices.Equal(info.Addrs, []string{trainer(3), "", ""}) {
		t.Fatalf("after stopping the metadata leader n%d: %+v, %v; want round 2 holding only %s at rank 0", l+1, info, err, trainer(3))
	}
	// The trainers of round 1 that are still alive re-join and complete it.
	for _, i := range []int{0, 1} {
		if _, round, err := live.Jobs().Join(ctx, "job", 3, -1, trainer(i)); err != nil || round != 2 {
			t.Fatalf("trainer %d re-joining: round %d, %v", i, round, err)
		}
	}
	info, err = live.Jobs().Wait(ctx, "job", 2)
	if err != nil || !info.Complete || info.Addrs[0] != trainer(3) {
		t.Fatalf("round 2 after the failover: %+v, %v", info, err)
	}

	if err := live.Jobs().Delete(ctx, "job"); err != nil {
		t.Fatal(err)
	}
	if _, err := live.Jobs().Get(ctx, "job"); !errors.Is(err, client.ErrUnknownJob) {
		t.Fatalf("GetJob after DeleteJob: %v, want ErrUnknownJob", err)
	}
	var re *client.RemoteError
	if _, err := live.Jobs().Wait(ctx, "job", 2); !errors.As(err, &re) || re.Code != codes.NotFound || !strings.Contains(err.Error(), `"job"`) {
		t.Fatalf("WaitJob after DeleteJob: %v, want NotFound naming the job", err)
	}
	if err := live.Jobs().Delete(ctx, "job"); !errors.Is(err, client.ErrUnknownJob) {
		t.Fatalf("deleting a deleted job: %v, want ErrUnknownJob", err)
	}
}

// TestJobSurvivesRestart: the registry is in the metadata group's log and
// snapshots, so a cluster restarted from its data dirs still has the job.
func TestJobSurvivesRestart(t *testing.T) {
	waitsMostly(t)
	c := StartCluster(t, 3, FastRaft())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl := c.Client()
	for i := range 2 {
		if _, _, err := cl.Jobs().Join(ctx, "job", 4, i*2, fmt.Sprintf("h%d:1", i)); err != nil {
			t.Fatal(err)
		}
	}
	// The metadata leader, which has applied both joins, restarts from a
	// snapshot holding the job, the others from their logs.
	l := metaLeader(t, c)
	if err := c.Node(l).MetaRaft().Snapshot().Error(); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		c.Kill(i)
	}
	for i := range 3 {
		c.Start(i)
	}
	// That node restored the snapshot as it started, before any leader could
	// send it anything: its own state shows the job.
	st, err := cl.Admin().NodeStatus(ctx, c.Addrs()[l], false)
	if err != nil || len(st.Jobs) != 1 || st.Jobs[0].Name != "job" || st.Jobs[0].Registered() != 2 {
		t.Fatalf("n%d's jobs after restoring its snapshot: %+v, %v", l+1, st.Jobs, err)
	}
	c.WaitMetaLeader(10 * time.Second)
	info, err := cl.Jobs().Get(ctx, "job")
	if err != nil || info.Round != 1 || !slices.Equal(info.Addrs, []string{"h0:1", "", "h1:1", ""}) {
		t.Fatalf("after a restart: %+v, %v", info, err)
	}
}
