package collective

import (
	"errors"
	"fmt"
)

// Sentinel errors. Every error the package returns wraps one of them, with
// the rank, the operation and (where there is one) the peer in its text.
var (
	// ErrConfig: the Config is invalid (its message names the field and value).
	ErrConfig = errors.New("invalid collective config")
	// ErrRefused: a peer refused the handshake, or this rank refused a peer
	// (wrong job, generation, group size, rank, or algorithm settings).
	ErrRefused = errors.New("handshake refused")
	// ErrJoinTimeout: Join gave up before every peer had connected.
	ErrJoinTimeout = errors.New("join timed out")
	// ErrPeerFailed: a peer closed its connection, failed, or stopped
	// answering within Config.Timeout during an operation. The error is a
	// *PeerError naming the peer.
	ErrPeerFailed = errors.New("peer failed")
	// ErrMismatch: a peer sent a message that does not fit the operation this
	// rank is running (another collective, another buffer length, another
	// root). The callers of the ranks disagree; it is a bug in the caller.
	ErrMismatch = errors.New("collective mismatch between ranks")
	// ErrGroupBroken: an earlier operation failed or was cancelled, so the
	// ranks are no longer in step. The Group is unusable; Close it and Join
	// a new Group (new Generation) with the survivors.
	ErrGroupBroken = errors.New("collective group broken")
	// ErrClosed: the Group was closed.
	ErrClosed = errors.New("collective group closed")
	// ErrBusy: another operation is in progress on this Group. Collective
	// operations must be issued one at a time, in the same order on every
	// rank.
	ErrBusy = errors.New("another collective operation is in progress")
	// ErrQuorumLost: a quorum run (JoinQuorum) can no longer complete steps:
	// fewer than Need ranks are left, or the open step did not collect Need
	// contributions within StepTimeout. Every rank's calls fail with it
	// (wrapped in ErrGroupBroken); on rank 0 the error also holds the
	// *PeerError of the last rank lost, if a rank was lost.
	ErrQuorumLost = errors.New("quorum lost")
	// ErrFinished: the quorum run is over: Next already returned the final
	// release, which takes no contributions.
	ErrFinished = errors.New("quorum run finished")
)

// PeerError is returned when an operation fails because of one peer: its
// connection was closed or reset, it stopped answering within the timeout,
// or it sent something unexpected. errors.Is(err, ErrPeerFailed) (or
// ErrMismatch) holds, and so does errors.Is against the underlying I/O error
// (io.EOF, os.ErrDeadlineExceeded, ...).
type PeerError struct {
	Rank int    // this rank
	Op   string // "allreduce", "broadcast", "barrier"
	Peer int    // the peer whose connection failed
	Kind error  // ErrPeerFailed or ErrMismatch
	Err  error  // the underlying error
	What string // human description, e.g. "closed the connection"
}

func (e *PeerError) Error() string {
	return fmt.Sprintf("collective: rank %d %s: peer rank %d %s: %v: %v", e.Rank, e.Op, e.Peer, e.What, e.Kind, e.Err)
}

// Unwrap exposes both the sentinel and the underlying error.
func (e *PeerError) Unwrap() []error { return []error{e.Kind, e.Err} }
