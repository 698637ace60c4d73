package shard

import (
	"cmp"
	"fmt"
	"slices"
	"unicode/utf8"

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
//     is ErrRankTaken;
//   - to a complete round by any other address (or with another world size)
//     starts round+1 holding only the joiner, with the joiner's world size:
//     a restarted or added trainer re-forms the job, and the old round's
//     trainers see the round change and join again;
//   - to an incomplete round takes the rank asked for if it is free
//     (ErrRankTaken if another address holds it), or with rank -1 the lowest
//     free rank in commit order. The world size must be the round's
//     (ErrWorldMismatch): an incomplete round cannot be resized, since its
//     members were told another size.
//
// Stored *shardpb.Job values are never modified (a change stores a new one),
// so readers may keep and send them without copying.
//
// There are no leases: a trainer that dies while its round is incomplete
// keeps its rank until the round completes and a newcomer re-forms the job,
// or the job is deleted.

// Limits of a JoinJob request. They bound a job's state, which every waiting
// trainer polls and every metadata snapshot holds.
const (
	maxJobWorld   = 64
	maxJobNameLen = 128
	maxJobAddrLen = 256
)

// checkJobName validates a job name, in requests and log entries alike.
func checkJobName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%w: job name is empty", ErrBadRequest)
	case len(name) > maxJobNameLen:
		return fmt.Errorf("%w: job name of %d bytes is longer than %d", ErrBadRequest, len(name), maxJobNameLen)
	case !utf8.ValidString(name):
		return fmt.Errorf("%w: job name is not UTF-8", ErrBadRequest)
	}
	return nil
}

// checkJoin validates a join's arguments. The client calls it before
// converting world and rank to the wire's narrower types, the node on the
// request, and Apply again on the log entry, so a bad entry (written by
// another version, say) fails alike on every replica.
func checkJoin(job string, world, rank int, addr string) error {
	if err := checkJobName(job); err != nil {
		return err
	}
	switch {
	case world < 1 || world > maxJobWorld:
		return fmt.Errorf("%w: job %q: world size %d is not within 1 to %d", ErrBadRequest, job, world, maxJobWorld)
	case rank < -1 || rank >= world:
		return fmt.Errorf("%w: job %q: rank %d is not within 0 to %d (or -1 for any free rank)", ErrBadRequest, job, rank, world-1)
	case addr == "":
		return fmt.Errorf("%w: job %q: the trainer's address is empty", ErrBadRequest, job)
	case len(addr) > maxJobAddrLen:
		return fmt.Errorf("%w: job %q: address of %d bytes is longer than %d", ErrBadRequest, job, len(addr), maxJobAddrLen)
	case !utf8.ValidString(addr):
		return fmt.Errorf("%w: job %q: address is not UTF-8", ErrBadRequest, job)
	}
	return nil
}

func checkJoinRequest(req *shardpb.JoinJobRequest) error {
	return checkJoin(req.Job, int(req.World), int(req.Rank), req.Addr)
}

// joinJob computes a join's outcome from the job's current state (nil: no
// such job yet) without modifying it: the job to store (cur itself if the
// join changed nothing) and the joiner's rank. It depends on nothing but its
// arguments, so every replica applying the same log computes the same result.
// req must have passed checkJoinRequest.
func joinJob(cur *shardpb.Job, req *shardpb.JoinJobRequest) (*shardpb.Job, uint32, error) {
	if cur == nil {
		cur = &shardpb.Job{Name: req.Job, World: req.World, Round: 1}
	}
	complete := len(cur.Members) == int(cur.World)
	if i := slices.IndexFunc(cur.Members, func(m *shardpb.JobMember) bool { return m.Addr == req.Addr }); i >= 0 && req.World == cur.World {
		held := cur.Members[i].Rank
		if req.Rank >= 0 && uint32(req.Rank) != held {
			return nil, 0, fmt.Errorf("job %q round %d: %w: %s already holds rank %d, and asks for rank %d", req.Job, cur.Round, ErrRankTaken, req.Addr, held, req.Rank)
		}
		return cur, held, nil
	}
	next := &shardpb.Job{Name: cur.Name, World: cur.World, Round: cur.Round, Members: cur.Members}
	switch {
	case complete:
		next = &shardpb.Job{Name: cur.Name, World: req.World, Round: cur.Round + 1}
	case req.World != cur.World:
		return nil, 0, fmt.Errorf("job %q round %d has world %d: %w: asked for %d (a round's size can change only once it is complete)", req.Job, cur.Round, cur.World, ErrWorldMismatch, req.World)
	}
	// Members are sorted by rank, so the first gap is the lowest free rank.
	var rank uint32
	if req.Rank >= 0 {
		rank = uint32(req.Rank)
		if i := slices.IndexFunc(next.Members, func(m *shardpb.JobMember) bool { return m.Rank == rank }); i >= 0 {
			return nil, 0, fmt.Errorf("job %q round %d: %w: rank %d is held by %s", req.Job, next.Round, ErrRankTaken, rank, next.Members[i].Addr)
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

// jobComplete reports whether every rank of the job's round is registered.
func jobComplete(j *shardpb.Job) bool { return len(j.Members) == int(j.World) }
