package replication

import (
	"errors"
	"fmt"

	"github.com/hashicorp/raft"
)

// Sentinel errors of the replication groups, and of the core that chain
// replicas share with them (package chain adds its own). Errors from store
// (ErrNonFinite, ErrDimMismatch, ...) pass through wrapped, so callers test
// both with errors.Is.
var (
	// ErrNotLeader: the request needs the group's leader and this replica is
	// not it. The error is a *NotLeaderError carrying the leader it knows of.
	ErrNotLeader = errors.New("not the leader")
	// ErrLeaderNotReady: this replica just became leader and has not yet
	// applied everything committed before its term; retry shortly.
	ErrLeaderNotReady = errors.New("leader not ready")
	// ErrUnknownOutcome: the push was handed to Raft (or a chain head's
	// log) but leadership was lost or the wait timed out before it was known
	// whether it committed. Retry it with the same (client, seq): it is
	// applied at most once.
	ErrUnknownOutcome = errors.New("outcome unknown")
	// ErrSequenceTooOld: the push's seq is further below the client's highest
	// applied seq than the dedupe window reaches, so whether it was applied
	// can no longer be told. A client keeps fewer than DedupeWindow pushes in
	// flight per group to avoid it.
	ErrSequenceTooOld = errors.New("sequence number too old")
	// ErrBadRequest: the request is malformed (zero client ID or seq, empty
	// batch, too large).
	ErrBadRequest = errors.New("bad request")
	// ErrBadEntry: a log entry that cannot be applied (it does not decode
	// whole, or is of no known type). The FSM refuses it whole, alike on
	// every replica, and changes nothing; the pushes in it fail with it. A
	// leader never builds one: it takes a bug or raw bytes in the log.
	ErrBadEntry = errors.New("bad log entry")
	// ErrGroupClosed: the group has been shut down on this node.
	ErrGroupClosed = errors.New("group closed")
	// ErrCorruptReplica: a replica's files failed a check on open (a bolt
	// page, a log entry's checksum, a snapshot's CRC) or opening them
	// panicked. The replica cannot be trusted; its node sets it aside and
	// has it rebuilt from its peers.
	ErrCorruptReplica = errors.New("corrupt replica")
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
