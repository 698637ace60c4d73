package client

import (
	"errors"

	"github.com/raftps/raftps/shard/api"
)

// The errors a node answers with, as the client returns them: test with
// errors.Is. Each is the error of one reason of the wire (shard/api), so it
// matches whatever the node's message says.
var (
	ErrNotLeader         = api.ErrNotLeader
	ErrUnknownOutcome    = api.ErrUnknownOutcome
	ErrBadRequest        = api.ErrBadRequest
	ErrUnknownTable      = api.ErrUnknownTable
	ErrTableExists       = api.ErrTableExists
	ErrInvalidConfig     = api.ErrInvalidConfig
	ErrDimMismatch       = api.ErrDimMismatch
	ErrNonFinite         = api.ErrNonFinite
	ErrTableFull         = api.ErrTableFull
	ErrRequestTooLarge   = api.ErrRequestTooLarge
	ErrWeakerConsistency = api.ErrWeakerConsistency
	ErrUnavailable       = api.ErrUnavailable
	ErrTooStale          = api.ErrTooStale
	ErrSequenceTooOld    = api.ErrSequenceTooOld
	ErrUnknownJob        = api.ErrUnknownJob
	ErrRankTaken         = api.ErrRankTaken
	ErrWorldMismatch     = api.ErrWorldMismatch
	ErrUnknownNode       = api.ErrUnknownNode
	ErrNodeConflict      = api.ErrNodeConflict
	ErrQuotaExceeded     = api.ErrQuotaExceeded
	ErrTableInUse        = api.ErrTableInUse
	ErrUnauthenticated   = api.ErrUnauthenticated
	ErrPermissionDenied  = api.ErrPermissionDenied
	ErrUnknownToken      = api.ErrUnknownToken
	ErrTokenExists       = api.ErrTokenExists
)

// Errors the client raises itself; no node answers them.
var (
	// ErrClientIDReused: a node answered "duplicate" to a push this Client
	// had never sent, so another Client (or an earlier process) used the
	// same ClientID and its pushes shadow this one's.
	ErrClientIDReused = errors.New("client ID reused")
	// ErrClientClosed: the Client was closed.
	ErrClientClosed = errors.New("client closed")
	// ErrJobRoundChanged: the job moved on from the round a trainer joined
	// (a trainer joined a complete round and started a new one, or the job
	// was deleted and registered anew). The trainer joins again.
	ErrJobRoundChanged = errors.New("job round changed")
)

// RemoteError is an error a node answered with: its gRPC code, the reason
// of the wire and the node's message. It unwraps to the reason's error.
type RemoteError = api.RemoteError

// retryable reports whether an error may go away by asking again,
// elsewhere or later; stale, whether it says the client's map is out of
// date (api.Retryable, api.Stale).
var retryable, stale = api.Retryable, api.Stale
