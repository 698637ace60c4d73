package replication

import (
	"errors"
	"fmt"

	"github.com/hashicorp/raft"
)

// Sentinel errors of the replication groups. Errors from store (ErrNonFinite,
// ErrDimMismatch, ...) pass through wrapped, so callers test both with errors.Is.
var (
	// ErrNotLeader: the request needs the group's leader and this replica is
	// not it. The error is a *NotLeaderError carrying the leader it knows of.
	ErrNotLeader = errors.New("not the leader")
	// ErrLeaderNotReady: this replica just became leader and has not yet
	// applied everything committed before its term; retry shortly.
	ErrLeaderNotReady = errors.New("leader not ready")
	// ErrUnknownOutcome: the push was handed to Raft but leadership was lost
	// or the wait timed out before it was known whether it committed. Retry
	// it with the same (client, seq): it is applied at most once.
	ErrUnknownOutcome = errors.New("outcome unknown")
	// ErrSequenceTooOld: the push's seq is further below the client's highest
	// applied seq than the dedupe window reaches, so whether it was applied
	// can no longer be told. A client keeps fewer than DedupeWindow pushes in
	// flight per group to avoid it.
	ErrSequenceTooOld = errors.New("sequence number too old")
	// ErrBadRequest: the request is malformed (zero client ID or seq, empty
	// batch, too large).
	ErrBadRequest = errors.New("bad request")
	// ErrGroupClosed: the group has been shut down on this node.
	ErrGroupClosed = errors.New("group closed")

	// ErrNotHead: a chain push reached a replica that is not the chain's
	// head. The error is a *NotHeadError carrying the head it knows of.
	ErrNotHead = errors.New("not the chain head")
	// ErrNotTail: a linearizable chain read (or a CRAQ read of dirty keys)
	// reached a replica that is not the chain's tail.
	ErrNotTail = errors.New("not the chain tail")
	// ErrStaleEpoch: a chain configuration or message is from an older epoch
	// than the receiver's (or from the same epoch with a different order).
	ErrStaleEpoch = errors.New("stale chain epoch")
	// ErrEpochAhead: a chain message is from a newer epoch than the
	// receiver's; the receiver refuses it until its own SetConfig catches up.
	ErrEpochAhead = errors.New("chain epoch ahead of this replica")
	// ErrNotMember: this node is not in the chain's current order (it was
	// removed, or has not been configured yet).
	ErrNotMember = errors.New("not a member of the chain")
	// ErrChainNotReady: the chain replica cannot serve the read yet: a new
	// tail (or a member that just reconnected) has not caught up with what
	// its predecessor knows to be committed. Retry shortly.
	ErrChainNotReady = errors.New("chain replica not caught up")
	// ErrReplicaBroken: the chain replica's disk failed; it accepts no
	// pushes or entries until it is reopened.
	ErrReplicaBroken = errors.New("replica storage failed")
)

// NotLeaderError is ErrNotLeader with the leader this replica knows of, if any.
type NotLeaderError struct {
	Group      string
	LeaderID   raft.ServerID
	LeaderAddr raft.ServerAddress
}

func (e *NotLeaderError) Error() string {
	if e.LeaderAddr == "" {
		return fmt.Sprintf("group %s: not the leader, leader unknown", e.Group)
	}
	return fmt.Sprintf("group %s: not the leader, leader is %s at %s", e.Group, e.LeaderID, e.LeaderAddr)
}

func (e *NotLeaderError) Unwrap() error { return ErrNotLeader }
