package auth

import (
	"github.com/raftps/raftps/shard/api"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The errors of this package. Every refusal is an *Error that wraps one of
// them.
var (
	// ErrUnauthenticated: the caller proved no identity this listener
	// accepts (no certificate or token, a token that is not valid, a
	// certificate without a raftps identity).
	ErrUnauthenticated = api.ErrUnauthenticated
	// ErrPermissionDenied: the caller is known and may not do this (a
	// reader pushing, a node certificate on the client API, a node
	// speaking for another node or for a group it is not in).
	ErrPermissionDenied = api.ErrPermissionDenied
)

// The reasons of the refusals on the wire: shard/api's, whose table maps
// them back to ErrUnauthenticated and ErrPermissionDenied, so errors.Is
// works across the wire.
const (
	ReasonUnauthenticated  = api.ReasonUnauthenticated
	ReasonPermissionDenied = api.ReasonPermissionDenied
)

// Error is a refusal: a message that says who was refused what and why,
// wrapping ErrUnauthenticated or ErrPermissionDenied. It is its own gRPC
// status (GRPCStatus), so an interceptor or handler may return it as it
// is.
type Error struct {
	err error // the sentinel
	msg string
}

func (e *Error) Error() string { return e.msg }
func (e *Error) Unwrap() error { return e.err }

// GRPCStatus is the status a refusal is answered with: Unauthenticated or
// PermissionDenied with the reason in an ErrorInfo detail.
func (e *Error) GRPCStatus() *status.Status {
	if e.err == ErrUnauthenticated {
		return api.NewStatus(codes.Unauthenticated, ReasonUnauthenticated, e.msg, nil)
	}
	return api.NewStatus(codes.PermissionDenied, ReasonPermissionDenied, e.msg, nil)
}

func unauthenticated(msg string) error { return &Error{err: ErrUnauthenticated, msg: msg} }
func denied(msg string) error          { return &Error{err: ErrPermissionDenied, msg: msg} }
