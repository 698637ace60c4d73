package shard

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/raftps/raftps/replication"
	"github.com/raftps/raftps/shard/api"
	"github.com/raftps/raftps/shard/grpcopt"
	"github.com/raftps/raftps/shard/internal/admission"
	"google.golang.org/grpc"
)

// Limits are a node's admission limits: how much one request may ask of
// it. A request over one is refused whole, before the work it asks for,
// with ResourceExhausted (api.ErrRequestTooLarge) or InvalidArgument
// (api.ErrBadRequest, a malformed message), and a message that names the
// limit and its value. docs/OPERATIONS.md ("Limits") lists them with their
// flags.
type Limits struct {
	// MaxMessageBytes is the largest message the client listener receives
	// (default DefaultMaxMessageBytes). Requests a little over it get the
	// handlers' own refusal (clientSlackBytes), larger ones gRPC's.
	MaxMessageBytes int
	// MaxAnswerBytes bounds the rows one Pull, or all parts of one
	// PullBatch together, may ask for (keys × dim × 4), checked before any
	// is allocated (default DefaultMaxAnswerBytes).
	MaxAnswerBytes int
	// MaxBatchParts bounds the parts of one PullBatch or PushBatch
	// (default DefaultMaxBatchParts), checked on the wire before the
	// request is decoded (package admission).
	MaxBatchParts int
	// BatchWorkers is how many parts of one batch are served at once
	// (default DefaultBatchWorkers).
	BatchWorkers int
	// MaxStreams and PeerMaxStreams bound the concurrent calls on one
	// connection to the client and the peer listener (HTTP/2
	// MaxConcurrentStreams; defaults DefaultMaxStreams and
	// DefaultPeerMaxStreams). A caller over it waits for a call to end.
	// The peer limit must exceed the streams one peer keeps open: a Raft
	// pipeline per group it leads here and a chain stream per chain.
	MaxStreams, PeerMaxStreams uint32
	// ChecksumInterval: Status with checksums scans this node's replicas at
	// most once per interval, whoever asks and however often; callers in
	// between share the last pass (default DefaultChecksumInterval).
	ChecksumInterval time.Duration
}

// Defaults of Limits.
const (
	DefaultMaxMessageBytes  = 16 << 20
	DefaultMaxAnswerBytes   = 64 << 20
	DefaultMaxBatchParts    = 2 * api.MaxShards // a client's batch holds a cold and a hot part per shard at most
	DefaultBatchWorkers     = 16
	DefaultMaxStreams       = 256
	DefaultPeerMaxStreams   = 1 << 14
	DefaultChecksumInterval = time.Second
	// PeerMaxElements bounds the repeated elements of one message on the
	// peer listener (package admission): far above any message a node
	// sends (heartbeat batches of replication.MaxHeartbeatBatch, chain
	// forwards of chain.MaxForwardEntries), far below what 129 MiB of empty
	// elements would decode to.
	PeerMaxElements = 1 << 18
	// minMessageBytes is the least MaxMessageBytes and MaxAnswerBytes may be.
	minMessageBytes = 64 << 10
)

// clientSlackBytes is how far over MaxMessageBytes the client listener
// admits a message, so that the handlers refuse it with a reason that names
// the limit instead of gRPC's bare ResourceExhausted.
const clientSlackBytes = 1 << 20

// withDefaults fills in the zero fields.
func (l Limits) withDefaults() Limits {
	if l.MaxMessageBytes == 0 {
		l.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if l.MaxAnswerBytes == 0 {
		l.MaxAnswerBytes = DefaultMaxAnswerBytes
	}
	if l.MaxBatchParts == 0 {
		l.MaxBatchParts = DefaultMaxBatchParts
	}
	if l.BatchWorkers == 0 {
		l.BatchWorkers = DefaultBatchWorkers
	}
	if l.MaxStreams == 0 {
		l.MaxStreams = DefaultMaxStreams
	}
	if l.PeerMaxStreams == 0 {
		l.PeerMaxStreams = DefaultPeerMaxStreams
	}
	if l.ChecksumInterval == 0 {
		l.ChecksumInterval = DefaultChecksumInterval
	}
	return l
}

// validate names the first limit out of range.
func (l Limits) validate() error {
	switch {
	case l.MaxMessageBytes < minMessageBytes:
		return fmt.Errorf("node config: MaxMessageBytes = %d (want at least %d)", l.MaxMessageBytes, minMessageBytes)
	case l.MaxAnswerBytes < minMessageBytes:
		return fmt.Errorf("node config: MaxAnswerBytes = %d (want at least %d)", l.MaxAnswerBytes, minMessageBytes)
	case l.MaxBatchParts < 1:
		return fmt.Errorf("node config: MaxBatchParts = %d (want at least 1)", l.MaxBatchParts)
	case l.BatchWorkers < 1:
		return fmt.Errorf("node config: BatchWorkers = %d (want at least 1)", l.BatchWorkers)
	case l.ChecksumInterval < 0:
		return fmt.Errorf("node config: ChecksumInterval = %s (want at least 0)", l.ChecksumInterval)
	}
	return nil
}

// serverOptions are the gRPC server options of the client listener, or of
// the peer listener if peer: receive and send limits, streams per
// connection, and the admission codec with its interceptors, which come
// first (on the client listener, within answerCodec). Transport security
// and authentication come before them (listenerOptions, security.go).
func (n *Node) serverOptions(peer bool) []grpc.ServerOption {
	refuse := func(err error) error {
		wire := api.ErrRequestTooLarge
		if errors.Is(err, admission.ErrMalformed) {
			wire = api.ErrBadRequest
		}
		return n.toStatus(fmt.Errorf("%w: %w", wire, err))
	}
	l := n.cfg.Limits
	if peer {
		// Raft's largest message, which is larger than a chain's
		// (replication.MaxRaftMessageBytes), and the transports'
		// keepalive pings.
		opts := admission.ServerOptions(admission.Codec{Limit: PeerMaxElements, What: "repeated elements per peer message"}, refuse)
		opts = append(opts, replication.ServerOptions()...)
		return append(opts, grpc.MaxConcurrentStreams(l.PeerMaxStreams))
	}
	opts := admission.ServerOptions(answerCodec{admission.Codec{Limit: l.MaxBatchParts, What: "parts per batch (MaxBatchParts)"}}, refuse)
	opts = append(opts, grpcopt.Server()...)
	return append(opts,
		grpc.MaxRecvMsgSize(l.MaxMessageBytes+clientSlackBytes),
		grpc.MaxSendMsgSize(max(l.MaxMessageBytes, l.MaxAnswerBytes)+clientSlackBytes),
		grpc.MaxConcurrentStreams(l.MaxStreams))
}

// checkParts refuses a batch of more than MaxBatchParts parts (the codec
// has refused it on the wire already, unless the call came in process).
func (n *Node) checkParts(what string, parts int) error {
	if limit := n.cfg.MaxBatchParts; parts > limit {
		return fmt.Errorf("%w: %s of %d parts; the limit is %d parts per batch (MaxBatchParts)", api.ErrRequestTooLarge, what, parts, limit)
	}
	return nil
}

// answerBudget is what is left of one request's MaxAnswerBytes: the parts
// of a PullBatch draw on one, a Pull on its own.
type answerBudget struct {
	limit int
	left  atomic.Int64
}

type answerBudgetKey struct{}

func newAnswerBudget(limit int) *answerBudget {
	b := &answerBudget{limit: limit}
	b.left.Store(int64(limit))
	return b
}

// answerBudgetOf is ctx's budget (a PullBatch's), or a new one.
func (n *Node) answerBudgetOf(ctx context.Context) *answerBudget {
	if b, ok := ctx.Value(answerBudgetKey{}).(*answerBudget); ok {
		return b
	}
	return newAnswerBudget(n.cfg.MaxAnswerBytes)
}

// take draws the answer of keys rows of dim values from the budget, or
// refuses it: before the rows are allocated.
func (b *answerBudget) take(keys, dim int) error {
	need := int64(keys) * int64(dim) * 4
	if need > int64(b.limit) {
		return fmt.Errorf("%w: %d keys of dim %d need a %d-byte answer; the limit is %d bytes per answer (MaxAnswerBytes)", api.ErrRequestTooLarge, keys, dim, need, b.limit)
	}
	if b.left.Add(-need) < 0 {
		return fmt.Errorf("%w: %d keys of dim %d need a %d-byte answer, which with the batch's other parts is over the limit of %d answer bytes per request (MaxAnswerBytes)", api.ErrRequestTooLarge, keys, dim, need, b.limit)
	}
	return nil
}

// checkBatchAnswer refuses a PullBatch whose parts together ask for more
// than MaxAnswerBytes of rows, by the tables this node knows, before any
// part runs; parts of tables it does not know yet are held to the rest of
// the budget as they run.
func (n *Node) checkBatchAnswer(keys func(i int) (table string, n int), parts int) error {
	var need int64
	for i := range parts {
		table, k := keys(i)
		if spec := n.metaFSM.Table(table); spec != nil {
			need += int64(k) * int64(spec.Dim) * 4
		}
	}
	if limit := n.cfg.MaxAnswerBytes; need > int64(limit) {
		return fmt.Errorf("%w: pull batch of %d parts needs a %d-byte answer; the limit is %d bytes per answer (MaxAnswerBytes)", api.ErrRequestTooLarge, parts, need, limit)
	}
	return nil
}
