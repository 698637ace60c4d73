package chain

import (
	"errors"
	"fmt"
)

// Sentinel errors of chain replicas. Those the replication core's
// (replication.ErrBadRequest, ErrUnknownOutcome, ErrGroupClosed, ...) and
// store's (ErrNonFinite, ...) pass through wrapped, so callers test all of
// them with errors.Is.
var (
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
	// ErrNotReady: the chain replica cannot serve the read yet: a new
	// tail (or a member that just reconnected) has not caught up with what
	// its predecessor knows to be committed. Retry shortly.
	ErrNotReady = errors.New("chain replica not caught up")
	// ErrReplicaBroken: the chain replica's disk failed; it accepts no
	// pushes or entries until it is reopened.
	ErrReplicaBroken = errors.New("replica storage failed")
	// ErrUnknownGroup: the chain is not on the node a message was sent to.
	// Its text names a raft group for history: clients tell errors apart by
	// the sentinel's text in a status message (shard's fromStatus), so it
	// stays.
	ErrUnknownGroup = errors.New("raft group not on this node")
)

// NotHeadError is ErrNotHead with the head this replica knows of, if any.
type NotHeadError struct {
	Group string
	Epoch uint64
	Head  string // "" if unknown
}

func (e *NotHeadError) Error() string {
	if e.Head == "" {
		return fmt.Sprintf("chain %s: not the head, head unknown (epoch %d)", e.Group, e.Epoch)
	}
	return fmt.Sprintf("chain %s: not the head, head is %s (epoch %d)", e.Group, e.Head, e.Epoch)
}

func (e *NotHeadError) Unwrap() error { return ErrNotHead }
