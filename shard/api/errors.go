package api

import (
	"context"
	"errors"
	"fmt"

	"github.com/raftps/raftps/shard/shardpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Reason names an error on the wire: every error status a node answers
// with carries it in an ErrorInfo detail. Reasons are stable words; a
// client decides what to do by the reason, never by the message.
type Reason string

// The reasons, in the order of reasonTable.
const (
	ReasonNotLeader         Reason = "NOT_LEADER"         // the group's leader (a chain's head) serves this; ErrorInfo names it when known
	ReasonLeaderNotReady    Reason = "LEADER_NOT_READY"   // a new leader has not applied its term's first entry yet
	ReasonUnknownOutcome    Reason = "UNKNOWN_OUTCOME"    // the push may or may not have been applied: retry with the same (client, seq)
	ReasonGroupClosed       Reason = "GROUP_CLOSED"       // the replica is closing
	ReasonSequenceTooOld    Reason = "SEQUENCE_TOO_OLD"   // a push's seq is below the dedupe window
	ReasonBadRequest        Reason = "BAD_REQUEST"        // malformed: empty, ragged bytes, bad IDs
	ReasonTooStale          Reason = "TOO_STALE"          // the replica cannot show its state is within the read's bound
	ReasonNotHot            Reason = "NOT_HOT"            // a hot-key read replica lacks the keys or its copy is old
	ReasonNotMember         Reason = "NOT_MEMBER"         // a chain replica is not in its chain's order
	ReasonNotTail           Reason = "NOT_TAIL"           // a chain read needs the tail
	ReasonChainStaleEpoch   Reason = "CHAIN_STALE_EPOCH"  // a chain message of an older epoch
	ReasonChainEpochAhead   Reason = "CHAIN_EPOCH_AHEAD"  // a chain message of an epoch this replica has not been given
	ReasonChainNotReady     Reason = "CHAIN_NOT_READY"    // a chain replica is catching up
	ReasonReplicaBroken     Reason = "REPLICA_BROKEN"     // the replica's storage failed
	ReasonUnknownGroup      Reason = "UNKNOWN_GROUP"      // the node does not hold the group (yet)
	ReasonUnknownTable      Reason = "UNKNOWN_TABLE"      // no such table
	ReasonTableExists       Reason = "TABLE_EXISTS"       // a table of that name exists
	ReasonInvalidConfig     Reason = "INVALID_CONFIG"     // a table spec or setting is out of range
	ReasonDimMismatch       Reason = "DIM_MISMATCH"       // keys and values disagree with the table's dimension
	ReasonNonFinite         Reason = "NON_FINITE"         // a NaN or Inf gradient, or an update that would overflow
	ReasonTableFull         Reason = "TABLE_FULL"         // the table holds as many rows as it may
	ReasonUnknownShard      Reason = "UNKNOWN_SHARD"      // the table has fewer shards
	ReasonRequestTooLarge   Reason = "REQUEST_TOO_LARGE"  // a request or its answer is over a size limit
	ReasonWeakerConsistency Reason = "WEAKER_CONSISTENCY" // a read asked for less than the table promises without allowing it
	ReasonUnavailable       Reason = "UNAVAILABLE"        // try again, here later or elsewhere
	ReasonUnknownJob        Reason = "UNKNOWN_JOB"        // no such trainer job
	ReasonRankTaken         Reason = "RANK_TAKEN"         // another trainer holds that rank of the round
	ReasonWorldMismatch     Reason = "WORLD_MISMATCH"     // a join's world size differs from the round's
	ReasonUnknownNode       Reason = "UNKNOWN_NODE"       // the cluster map has no such node
	ReasonEpochChanged      Reason = "EPOCH_CHANGED"      // a shard's map entry changed since a change to it was decided
	ReasonNodeConflict      Reason = "NODE_CONFLICT"      // a node's ID or address clashes, or a drain or removal is refused
	ReasonStaleMap          Reason = "STALE_MAP"          // the request carried an older epoch of the shard's map entry
	ReasonNotReplica        Reason = "NOT_REPLICA"        // the node's map does not place the shard on it
	ReasonBadEntry          Reason = "BAD_ENTRY"          // the log entry holding the push could not be applied on any replica (a bug); nothing of it was
	ReasonQuotaExceeded     Reason = "QUOTA_EXCEEDED"     // a limit on tables, replicas per node or jobs would be exceeded; the message names it
	ReasonTableInUse        Reason = "TABLE_IN_USE"       // a job in the registry uses the table (drop it with force)
	ReasonClusterMismatch   Reason = "CLUSTER_MISMATCH"   // a node's data dir belongs to another cluster
	ReasonDiskFull          Reason = "DISK_FULL"          // the node's data disk is below its minimum free space: writes refused until space returns
	ReasonUnauthenticated   Reason = "UNAUTHENTICATED"    // no credential this listener accepts (shard/auth)
	ReasonPermissionDenied  Reason = "PERMISSION_DENIED"  // the caller's role or identity may not do this (shard/auth)
	ReasonUnknownToken      Reason = "UNKNOWN_TOKEN"      // no bearer token of that ID or name
	ReasonTokenExists       Reason = "TOKEN_EXISTS"       // a bearer token of that ID or name exists
)

// The errors a node answers with, one per reason. A node's own errors wrap
// these or are mapped to them at its gRPC edge; a client gets them back
// from FromStatus, so errors.Is works alike on both sides of the wire.
var (
	ErrNotLeader         = errors.New("not the leader")
	ErrLeaderNotReady    = errors.New("leader not ready")
	ErrUnknownOutcome    = errors.New("outcome unknown")
	ErrGroupClosed       = errors.New("replica closed")
	ErrSequenceTooOld    = errors.New("push sequence number below the dedupe window")
	ErrBadRequest        = errors.New("invalid request")
	ErrTooStale          = errors.New("replica too stale")
	ErrNotHot            = errors.New("not a read replica of the keys")
	ErrNotMember         = errors.New("not a member of the chain")
	ErrNotTail           = errors.New("not the chain's tail")
	ErrChainStaleEpoch   = errors.New("stale chain epoch")
	ErrChainEpochAhead   = errors.New("chain epoch ahead")
	ErrChainNotReady     = errors.New("chain replica not ready")
	ErrReplicaBroken     = errors.New("replica broken")
	ErrUnknownGroup      = errors.New("unknown group")
	ErrUnknownTable      = errors.New("unknown table")
	ErrTableExists       = errors.New("table exists")
	ErrInvalidConfig     = errors.New("invalid table config")
	ErrDimMismatch       = errors.New("dimension mismatch")
	ErrNonFinite         = errors.New("non-finite value")
	ErrTableFull         = errors.New("table full")
	ErrUnknownShard      = errors.New("unknown shard")
	ErrRequestTooLarge   = errors.New("request too large")
	ErrWeakerConsistency = errors.New("consistency weaker than the table's")
	ErrUnavailable       = errors.New("unavailable")
	ErrUnknownJob        = errors.New("unknown job")
	ErrRankTaken         = errors.New("rank taken")
	ErrWorldMismatch     = errors.New("world size mismatch")
	ErrUnknownNode       = errors.New("unknown node")
	ErrEpochChanged      = errors.New("shard epoch changed")
	ErrNodeConflict      = errors.New("node conflict")
	ErrStaleMap          = errors.New("stale shard map")
	ErrNotReplica        = errors.New("not a replica of the shard")
	ErrBadEntry          = errors.New("bad log entry")
	ErrQuotaExceeded     = errors.New("quota exceeded")
	ErrTableInUse        = errors.New("table in use")
	ErrClusterMismatch   = errors.New("data dir of another cluster")
	ErrDiskFull          = errors.New("disk full")
	ErrUnauthenticated   = errors.New("unauthenticated")
	ErrPermissionDenied  = errors.New("permission denied")
	ErrUnknownToken      = errors.New("unknown token")
	ErrTokenExists       = errors.New("token exists")
)

// reasonTable is the one table of reasons, their gRPC codes and errors.
var reasonTable = []struct {
	reason Reason
	code   codes.Code
	err    error
}{
	{ReasonNotLeader, codes.FailedPrecondition, ErrNotLeader},
	{ReasonLeaderNotReady, codes.Unavailable, ErrLeaderNotReady},
	{ReasonUnknownOutcome, codes.Unavailable, ErrUnknownOutcome},
	{ReasonGroupClosed, codes.Unavailable, ErrGroupClosed},
	{ReasonSequenceTooOld, codes.FailedPrecondition, ErrSequenceTooOld},
	{ReasonBadRequest, codes.InvalidArgument, ErrBadRequest},
	{ReasonTooStale, codes.Unavailable, ErrTooStale},
	{ReasonNotHot, codes.Unavailable, ErrNotHot},
	{ReasonNotMember, codes.FailedPrecondition, ErrNotMember},
	{ReasonNotTail, codes.Unavailable, ErrNotTail},
	{ReasonChainStaleEpoch, codes.Unavailable, ErrChainStaleEpoch},
	{ReasonChainEpochAhead, codes.Unavailable, ErrChainEpochAhead},
	{ReasonChainNotReady, codes.Unavailable, ErrChainNotReady},
	{ReasonReplicaBroken, codes.Unavailable, ErrReplicaBroken},
	{ReasonUnknownGroup, codes.Unavailable, ErrUnknownGroup},
	{ReasonUnknownTable, codes.NotFound, ErrUnknownTable},
	{ReasonTableExists, codes.AlreadyExists, ErrTableExists},
	{ReasonInvalidConfig, codes.InvalidArgument, ErrInvalidConfig},
	{ReasonDimMismatch, codes.InvalidArgument, ErrDimMismatch},
	{ReasonNonFinite, codes.InvalidArgument, ErrNonFinite},
	{ReasonTableFull, codes.ResourceExhausted, ErrTableFull},
	{ReasonUnknownShard, codes.NotFound, ErrUnknownShard},
	{ReasonRequestTooLarge, codes.ResourceExhausted, ErrRequestTooLarge},
	{ReasonWeakerConsistency, codes.InvalidArgument, ErrWeakerConsistency},
	{ReasonUnavailable, codes.Unavailable, ErrUnavailable},
	{ReasonUnknownJob, codes.NotFound, ErrUnknownJob},
	{ReasonRankTaken, codes.AlreadyExists, ErrRankTaken},
	{ReasonWorldMismatch, codes.InvalidArgument, ErrWorldMismatch},
	{ReasonUnknownNode, codes.NotFound, ErrUnknownNode},
	{ReasonEpochChanged, codes.Aborted, ErrEpochChanged},
	{ReasonNodeConflict, codes.FailedPrecondition, ErrNodeConflict},
	{ReasonStaleMap, codes.FailedPrecondition, ErrStaleMap},
	{ReasonNotReplica, codes.FailedPrecondition, ErrNotReplica},
	{ReasonBadEntry, codes.Internal, ErrBadEntry},
	{ReasonQuotaExceeded, codes.ResourceExhausted, ErrQuotaExceeded},
	{ReasonTableInUse, codes.FailedPrecondition, ErrTableInUse},
	{ReasonClusterMismatch, codes.FailedPrecondition, ErrClusterMismatch},
	{ReasonDiskFull, codes.ResourceExhausted, ErrDiskFull},
	{ReasonUnauthenticated, codes.Unauthenticated, ErrUnauthenticated},
	{ReasonPermissionDenied, codes.PermissionDenied, ErrPermissionDenied},
	{ReasonUnknownToken, codes.NotFound, ErrUnknownToken},
	{ReasonTokenExists, codes.AlreadyExists, ErrTokenExists},
}

// Reasons returns every reason with its gRPC code and error, for tests and
// documentation.
func Reasons() []struct {
	Reason Reason
	Code   codes.Code
	Err    error
} {
	out := make([]struct {
		Reason Reason
		Code   codes.Code
		Err    error
	}, len(reasonTable))
	for i, r := range reasonTable {
		out[i].Reason, out[i].Code, out[i].Err = r.reason, r.code, r.err
	}
	return out
}

// ReasonOf returns the reason of the first error of this package that err
// wraps, in the table's order, and its gRPC code.
func ReasonOf(err error) (Reason, codes.Code, bool) {
	for _, r := range reasonTable {
		if errors.Is(err, r.err) {
			return r.reason, r.code, true
		}
	}
	return "", 0, false
}

// ErrorOf returns the error of a reason (nil for an unknown one).
func ErrorOf(r Reason) error {
	for _, e := range reasonTable {
		if e.reason == r {
			return e.err
		}
	}
	return nil
}

// NotLeaderError is a refusal by a replica that is not its group's leader
// (or a chain member that is not the head), naming the leader it knows,
// if any: its node ID and client address.
type NotLeaderError struct {
	Group      string
	LeaderID   string
	LeaderAddr string
}

func (e *NotLeaderError) Error() string {
	if e.LeaderAddr == "" && e.LeaderID == "" {
		return fmt.Sprintf("group %s: %v, and no leader is known", e.Group, ErrNotLeader)
	}
	return fmt.Sprintf("group %s: %v: the leader is %s at %s", e.Group, ErrNotLeader, e.LeaderID, e.LeaderAddr)
}

func (e *NotLeaderError) Unwrap() error { return ErrNotLeader }

// NewStatus is the status a node answers with for an error of reason r
// (code its gRPC code), with the message msg and, for NOT_LEADER, the
// leader nl names.
func NewStatus(code codes.Code, r Reason, msg string, nl *NotLeaderError) *status.Status {
	st := status.New(code, msg)
	info := &shardpb.ErrorInfo{Reason: string(r)}
	if nl != nil {
		info.Group, info.LeaderId, info.LeaderAddr = nl.Group, nl.LeaderID, nl.LeaderAddr
	}
	if d, err := st.WithDetails(info); err == nil {
		st = d
	}
	return st
}

// RemoteError is an error a node answered with. It unwraps to the error of
// its reason (ErrNotLeader, ErrUnknownTable, ...), so callers test it with
// errors.Is exactly like a local error.
type RemoteError struct {
	Code   codes.Code
	Reason Reason
	Msg    string
	// From a NOT_LEADER answer: the leader the node knows (empty if none).
	Group, LeaderID, LeaderAddr string
	err                         error
}

func (e *RemoteError) Error() string { return e.Msg }
func (e *RemoteError) Unwrap() error { return e.err }

// FromStatus converts an error returned by a gRPC call to a *RemoteError
// (errors that carry no status are returned as they are). The reason in the
// ErrorInfo detail decides which error it unwraps to; a status without one
// (the transport's own, or a node of another version) is classed by its
// code: Unavailable as ErrUnavailable, ResourceExhausted as
// ErrRequestTooLarge (gRPC's own refusal of a message over the receive
// limit, which carries no detail), DeadlineExceeded and Canceled as the
// context's errors.
func FromStatus(err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	return FromStatusProto(st)
}

// FromStatusProto is FromStatus of a status (a batch part's, say).
func FromStatusProto(st *status.Status) error {
	re := &RemoteError{Code: st.Code(), Msg: st.Message()}
	for _, d := range st.Details() {
		if info, ok := d.(*shardpb.ErrorInfo); ok {
			re.Reason = Reason(info.Reason)
			re.Group, re.LeaderID, re.LeaderAddr = info.Group, info.LeaderId, info.LeaderAddr
			re.err = ErrorOf(re.Reason)
			break
		}
	}
	if re.err == nil {
		switch st.Code() {
		case codes.Unavailable:
			re.err = ErrUnavailable
		case codes.ResourceExhausted:
			re.err = ErrRequestTooLarge
		case codes.DeadlineExceeded:
			re.err = context.DeadlineExceeded
		case codes.Canceled:
			re.err = context.Canceled
		}
	}
	return re
}

// PartStatus is the status of a failed batch part, as a PartError holds it.
func PartStatus(pe *shardpb.PartError) *status.Status {
	st := status.New(codes.Code(pe.GetCode()), pe.GetMessage())
	if pe.GetInfo() != nil {
		if d, err := st.WithDetails(pe.Info); err == nil {
			st = d
		}
	}
	return st
}

// ToPartError is the PartError of a handler's status error (nil: success,
// a zero PartError, since a repeated message field may hold no nil).
func ToPartError(err error) *shardpb.PartError {
	if err == nil {
		return &shardpb.PartError{}
	}
	st := status.Convert(err)
	pe := &shardpb.PartError{Code: uint32(st.Code()), Message: st.Message()}
	for _, d := range st.Details() {
		if info, ok := d.(*shardpb.ErrorInfo); ok {
			pe.Info = info
		}
	}
	return pe
}

// Retryable reports whether an error a node answered with may go away by
// asking again, elsewhere or later: not the leader, leader not ready,
// outcome unknown, node or replica not available, a replica that cannot
// serve this read, a chain reconfiguring or catching up, a map that moved
// (Stale).
func Retryable(err error) bool {
	for _, e := range []error{ErrNotLeader, ErrUnavailable, ErrLeaderNotReady, ErrUnknownOutcome,
		ErrGroupClosed, ErrTooStale, ErrNotHot, ErrNotTail, ErrChainStaleEpoch, ErrChainEpochAhead,
		ErrChainNotReady, ErrReplicaBroken, ErrUnknownGroup} {
		if errors.Is(err, e) {
			return true
		}
	}
	return Stale(err)
}

// Stale reports whether err says the caller's map is out of date: a node
// the map no longer places the shard on, an older epoch of the shard's map
// entry, or a chain replica no longer in its chain's order.
func Stale(err error) bool {
	return errors.Is(err, ErrStaleMap) || errors.Is(err, ErrNotReplica) || errors.Is(err, ErrNotMember)
}
