package shard

import (
	"context"
	"errors"
	"strings"

	"github.com/raftps/raftps/replication"
	"github.com/raftps/raftps/replication/chain"
	"github.com/raftps/raftps/shard/shardpb"
	"github.com/raftps/raftps/store"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Sentinel errors of the cluster layer. Each text is distinct from every
// other sentinel's in codeOf, and no text contains another of the same code:
// fromStatus tells them apart by the message alone.
var (
	// ErrBadRequest: the request is malformed (empty, ragged key bytes, ...).
	// Not "bad request", which is replication.ErrBadRequest's text.
	ErrBadRequest        = errors.New("invalid request")
	ErrUnknownShard      = errors.New("unknown shard")
	ErrRequestTooLarge   = errors.New("request too large")
	ErrWeakerConsistency = errors.New("consistency weaker than the table's")
	ErrUnavailable       = errors.New("unavailable")
	// ErrClientIDReused: a node answered "duplicate" to a push this Client
	// had never sent, so another Client (or an earlier process) used the
	// same ClientID and its pushes shadow this one's. Raised by the client
	// only; no node answers it.
	ErrClientIDReused = errors.New("client ID reused")
	// ErrClientClosed: the Client was closed. Raised by the client only.
	ErrClientClosed = errors.New("client closed")
	// ErrUnknownJob: the trainer job registry has no such job.
	ErrUnknownJob = errors.New("unknown job")
	// ErrRankTaken: a JoinJob asked for a rank of the job's current,
	// incomplete round that another address holds, or its address already
	// holds another rank of that round.
	ErrRankTaken = errors.New("rank taken")
	// ErrWorldMismatch: a JoinJob's world size differs from that of the job's
	// current round, which is not complete yet (a complete round may be
	// followed by one of another size).
	ErrWorldMismatch = errors.New("world size mismatch")
	// ErrJobRoundChanged: the job moved on from the round a trainer joined
	// (a trainer joined a complete round and started a new one, or the job
	// was deleted and registered anew). The trainer joins again. Raised by
	// the client only (WaitJob); no node answers it.
	ErrJobRoundChanged = errors.New("job round changed")
	// ErrUnknownNode: the cluster map has no such node.
	ErrUnknownNode = errors.New("unknown node")
	// ErrEpochChanged: a shard's map entry changed since a change to it was
	// decided (the compare-and-set on its epoch failed); decide again.
	ErrEpochChanged = errors.New("shard epoch changed")
	// ErrNodeConflict: a node registers with the address of another node,
	// or under the ID of a removed one; or a drain or removal is refused.
	ErrNodeConflict = errors.New("node conflict")
	// ErrStaleEpoch: the request carried an older epoch of the shard's map
	// entry than the node has. The client refreshes its map and retries.
	ErrStaleEpoch = errors.New("stale shard map")
	// ErrNotReplica: the node does not hold the shard (by its map). The
	// client refreshes its map and retries at the shard's replicas.
	ErrNotReplica = errors.New("not a replica of the shard")
	// ErrTooStale: the replica cannot show that its state is within the
	// staleness bound of the read (no fresh read lease: the leader is
	// unreachable or the replica lags). The client asks another replica.
	ErrTooStale = errors.New("replica too stale")
	// ErrNotHot: a read replica of hot keys was asked for keys it does not
	// hold, or its copy is too old to serve. The client asks the shard.
	ErrNotHot = errors.New("not a read replica of the keys")
)

// codeOf is the one table from errors to gRPC codes. The first sentinel the
// error wraps decides; anything else is Internal.
var codeOf = []struct {
	err  error
	code codes.Code
}{
	// First: their messages embed the error that made the replica refuse
	// (a leader not ready, unavailable, ...), and fromStatus takes the
	// first sentinel whose text the message contains.
	{ErrTooStale, codes.Unavailable},
	{ErrNotHot, codes.Unavailable},
	{replication.ErrNotLeader, codes.FailedPrecondition},
	{replication.ErrLeaderNotReady, codes.Unavailable},
	{replication.ErrUnknownOutcome, codes.Unavailable},
	{replication.ErrGroupClosed, codes.Unavailable},
	{replication.ErrSequenceTooOld, codes.FailedPrecondition},
	{replication.ErrBadRequest, codes.InvalidArgument},
	// Chain replicas. A push at a member that is not the head carries the
	// head as a NotLeader detail (toStatus), so it comes back as
	// ErrNotLeader and the client follows it; a node no longer in the
	// chain's order makes the client refresh its map (stale); the rest pass
	// with time or at another member (retryable).
	{chain.ErrNotHead, codes.FailedPrecondition},
	{chain.ErrNotMember, codes.FailedPrecondition},
	{chain.ErrNotTail, codes.Unavailable},
	{chain.ErrStaleEpoch, codes.Unavailable},
	{chain.ErrEpochAhead, codes.Unavailable},
	{chain.ErrNotReady, codes.Unavailable},
	{chain.ErrReplicaBroken, codes.Unavailable},
	{chain.ErrUnknownGroup, codes.Unavailable},
	{store.ErrUnknownTable, codes.NotFound},
	{store.ErrTableExists, codes.AlreadyExists},
	{store.ErrInvalidConfig, codes.InvalidArgument},
	{store.ErrDimMismatch, codes.InvalidArgument},
	{store.ErrNonFinite, codes.InvalidArgument},
	{store.ErrTableFull, codes.ResourceExhausted},
	{ErrBadRequest, codes.InvalidArgument},
	{ErrUnknownShard, codes.NotFound},
	{ErrRequestTooLarge, codes.ResourceExhausted},
	{ErrWeakerConsistency, codes.InvalidArgument},
	{ErrUnavailable, codes.Unavailable},
	{ErrClientIDReused, codes.FailedPrecondition},
	{ErrUnknownJob, codes.NotFound},
	{ErrRankTaken, codes.AlreadyExists},
	{ErrWorldMismatch, codes.InvalidArgument},
	{ErrJobRoundChanged, codes.Aborted},
	{ErrUnknownNode, codes.NotFound},
	{ErrEpochChanged, codes.Aborted},
	{ErrNodeConflict, codes.FailedPrecondition},
	{ErrStaleEpoch, codes.FailedPrecondition},
	{ErrNotReplica, codes.FailedPrecondition},
	{context.DeadlineExceeded, codes.DeadlineExceeded},
	{context.Canceled, codes.Canceled},
}

// toStatus converts a server-side error to the status a handler returns; a
// not-leader error carries the leader as a NotLeader detail.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	code := codes.Internal
	for _, e := range codeOf {
		if errors.Is(err, e.err) {
			code = e.code
			break
		}
	}
	st := status.New(code, err.Error())
	var nl *replication.NotLeaderError
	var nh *chain.NotHeadError
	switch {
	case errors.As(err, &nl):
		if d, derr := st.WithDetails(&shardpb.NotLeader{Group: nl.Group, LeaderId: string(nl.LeaderID), LeaderAddr: string(nl.LeaderAddr)}); derr == nil {
			st = d
		}
	case errors.As(err, &nh):
		// A chain's head plays its leader's part for pushes.
		if d, derr := st.WithDetails(&shardpb.NotLeader{Group: nh.Group, LeaderAddr: nh.Head}); derr == nil {
			st = d
		}
	}
	return st.Err()
}

// RemoteError is an error a node answered with. It unwraps to the sentinel
// its code stands for (ErrNotLeader for FailedPrecondition with a leader
// hint, store.ErrUnknownTable for NotFound, ...), so callers test it with
// errors.Is exactly like a local error.
type RemoteError struct {
	Code       codes.Code
	Msg        string
	LeaderAddr string // from a NotLeader detail
	sentinel   error
}

func (e *RemoteError) Error() string { return e.Msg }
func (e *RemoteError) Unwrap() error { return e.sentinel }

// fromStatus converts a client-side gRPC error back to a RemoteError.
func fromStatus(err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	re := &RemoteError{Code: st.Code(), Msg: st.Message()}
	for _, d := range st.Details() {
		if nl, ok := d.(*shardpb.NotLeader); ok {
			re.LeaderAddr = nl.LeaderAddr
			re.sentinel = replication.ErrNotLeader
			return re
		}
	}
	// The message names the sentinel's text: the first in codeOf whose
	// text it contains wins, so codeOf lists the wrapping sentinels first.
	for _, e := range codeOf {
		if e.code == st.Code() && strings.Contains(st.Message(), e.err.Error()) {
			re.sentinel = e.err
			return re
		}
	}
	switch st.Code() {
	case codes.Unavailable:
		re.sentinel = ErrUnavailable
	case codes.DeadlineExceeded:
		re.sentinel = context.DeadlineExceeded
	case codes.Canceled:
		re.sentinel = context.Canceled
	}
	return re
}
