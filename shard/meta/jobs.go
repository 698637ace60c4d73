package meta

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/raftps/raftps/shard/api"

	"github.com/raftps/raftps/shard/shardpb"
)

// The trainer job registry: trainers of one job find each other's collective
// addresses through the metadata group, in rounds, like torch-elastic's
// rendezvous. Every change is a metadata log entry, so the registry survives
// any minority of nodes and every replica holds the same jobs.
//
// A job's members belong to its current round (numbered from 1). A join:
//   - by an address already in the round, with the round's world size, is
//     idempotent: it returns that address's rank (a retry of a join whose
//     answer was lost, or a trainer asking again); asking for another rank
//     is api.ErrRankTaken;
//   - to a complete round by any other address (or with another world size)
//     starts round+1 holding only the joiner, with the joiner's world size:
//     a restarted or added trainer re-forms the job, and the old round's
//     trainers see the round change and join again;
//   - to an incomplete round takes the rank asked for if it is free
//     (api.ErrRankTaken if another address holds it), or with rank -1 the lowest
//     free rank in commit order. The world size must be the round's
//     (api.ErrWorldMismatch): an incomplete round cannot be resized, since its
//     members were told another size.
//
// Stored *shardpb.Job values are never modified (a change stores a new one),
// so readers may keep and send them without copying.
//
// There are no leases: a trainer that dies while its round is incomplete
// keeps its rank until the round completes and a newcomer re-forms the job,
// or the job is deleted.

// CheckJoinRequest checks a join's fields (api.CheckJoin): the node checks
// a request before it proposes it, and Apply checks the entry again.
func CheckJoinRequest(req *shardpb.JoinJobRequest) error {
	return api.CheckJoin(req.Job, int(req.World), int(req.Rank), req.Addr)
}

// joinJob computes a join's outcome from the job's current state (nil: no
// such job yet) without modifying it: the job to store (cur itself if the
// join changed nothing) and the joiner's rank. It depends on nothing but its
// arguments, so every replica applying the same log computes the same result.
// req must have passed CheckJoinRequest.
func joinJob(cur *shardpb.Job, req *shardpb.JoinJobRequest) (*shardpb.Job, uint32, error) {
	if cur == nil {
		cur = &shardpb.Job{Name: req.Job, World: req.World, Round: 1}
	}
	complete := len(cur.Members) == int(cur.World)
	if i := slices.IndexFunc(cur.Members, func(m *shardpb.JobMember) bool { return m.Addr == req.Addr }); i >= 0 && req.World == cur.World {
		held := cur.Members[i].Rank
		if req.Rank >= 0 && uint32(req.Rank) != held {
			return nil, 0, fmt.Errorf("job %q round %d: %w: %s already holds rank %d, and asks for rank %d", req.Job, cur.Round, api.ErrRankTaken, req.Addr, held, req.Rank)
		}
		return cur, held, nil
	}
	next := &shardpb.Job{Name: cur.Name, World: cur.World, Round: cur.Round, Members: cur.Members}
	switch {
	case complete:
		next = &shardpb.Job{Name: cur.Name, World: req.World, Round: cur.Round + 1}
	case req.World != cur.World:
		return nil, 0, fmt.Errorf("job %q round %d has world %d: %w: asked for %d (a round's size can change only once it is complete)", req.Job, cur.Round, cur.World, api.ErrWorldMismatch, req.World)
	}
	// Members are sorted by rank, so the first gap is the lowest free rank.
	var rank uint32
	if req.Rank >= 0 {
		rank = uint32(req.Rank)
		if i := slices.IndexFunc(next.Members, func(m *shardpb.JobMember) bool { return m.Rank == rank }); i >= 0 {
			return nil, 0, fmt.Errorf("job %q round %d: %w: rank %d is held by %s", req.Job, next.Round, api.ErrRankTaken, rank, next.Members[i].Addr)
		}
	} else {
		for _, m := range next.Members {
			if m.Rank != rank {
				break
			}
			rank++
		}
	}
	at, _ := slices.BinarySearchFunc(next.Members, rank, func(m *shardpb.JobMember, r uint32) int { return cmp.Compare(m.Rank, r) })
	next.Members = slices.Insert(slices.Clone(next.Members), at, &shardpb.JobMember{Rank: rank, Addr: req.Addr})
	return next, rank, nil
}

// JobComplete reports whether every rank of the job's round is registered.
func JobComplete(j *shardpb.Job) bool { return len(j.Members) == int(j.World) }
