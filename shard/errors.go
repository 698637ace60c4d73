package shard

import (
	"context"
	"errors"

	"github.com/raftps/raftps/replication"
	"github.com/raftps/raftps/replication/chain"
	"github.com/raftps/raftps/shard/api"
	"github.com/raftps/raftps/shard/diskguard"
	"github.com/raftps/raftps/store"
	"google.golang.org/grpc/codes"
)

// internalErrors maps the errors of the packages below the node, which know
// nothing of the wire, to the errors of the wire (shard/api), whose reasons
// and codes clients decide by. The node's own errors wrap api's errors
// directly.
var internalErrors = []struct{ err, wire error }{
	{replication.ErrNotLeader, api.ErrNotLeader},
	// A chain's head plays its leader's part for pushes: a push at another
	// member is refused with the head named, and the client follows it.
	{chain.ErrNotHead, api.ErrNotLeader},
	{replication.ErrLeaderNotReady, api.ErrLeaderNotReady},
	{replication.ErrUnknownOutcome, api.ErrUnknownOutcome},
	{replication.ErrGroupClosed, api.ErrGroupClosed},
	{replication.ErrSequenceTooOld, api.ErrSequenceTooOld},
	{replication.ErrBadRequest, api.ErrBadRequest},
	{replication.ErrBadEntry, api.ErrBadEntry},
	{chain.ErrNotMember, api.ErrNotMember},
	{chain.ErrNotTail, api.ErrNotTail},
	{chain.ErrStaleEpoch, api.ErrChainStaleEpoch},
	{chain.ErrEpochAhead, api.ErrChainEpochAhead},
	{chain.ErrNotReady, api.ErrChainNotReady},
	{chain.ErrReplicaBroken, api.ErrReplicaBroken},
	{chain.ErrUnknownGroup, api.ErrUnknownGroup},
	{store.ErrUnknownTable, api.ErrUnknownTable},
	{store.ErrTableExists, api.ErrTableExists},
	{store.ErrInvalidConfig, api.ErrInvalidConfig},
	{store.ErrDimMismatch, api.ErrDimMismatch},
	{store.ErrNonFinite, api.ErrNonFinite},
	{store.ErrTableFull, api.ErrTableFull},
	{diskguard.ErrDiskFull, api.ErrDiskFull},
}

// reasonOf is the wire reason and gRPC code of a node's error: the first of
// api's errors it wraps, else the first internal error, else none
// (Internal), with the context's errors as their own codes.
func reasonOf(err error) (api.Reason, codes.Code) {
	if r, code, ok := api.ReasonOf(err); ok {
		return r, code
	}
	for _, e := range internalErrors {
		if errors.Is(err, e.err) {
			r, code, _ := api.ReasonOf(e.wire)
			return r, code
		}
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return "", codes.DeadlineExceeded
	case errors.Is(err, context.Canceled):
		return "", codes.Canceled
	}
	return "", codes.Internal
}

// toStatus converts an error of a handler to the status it answers with:
// the reason and code of reasonOf, and for a refusal by a replica that is
// not its group's leader (or a chain member that is not the head) the
// leader it knows, by node ID and client address. This is the one place
// errors become gRPC statuses.
func (n *Node) toStatus(err error) error {
	if err == nil {
		return nil
	}
	r, code := reasonOf(err)
	var nl *api.NotLeaderError
	var rnl *replication.NotLeaderError
	var nh *chain.NotHeadError
	switch {
	case errors.As(err, &nl):
	case errors.As(err, &rnl):
		nl = &api.NotLeaderError{Group: rnl.Group, LeaderID: string(rnl.LeaderID)}
		nl.LeaderAddr = n.clientAddrOf(nl.LeaderID, string(rnl.LeaderAddr))
	case errors.As(err, &nh):
		nl = &api.NotLeaderError{Group: nh.Group}
		nl.LeaderID, nl.LeaderAddr = n.nodeAt(nh.Head)
	}
	return api.NewStatus(code, r, err.Error(), nl).Err()
}

// fromStatus converts the error of a call to another node back to an error
// that unwraps to api's (see api.FromStatus).
func fromStatus(err error) error { return api.FromStatus(err) }
