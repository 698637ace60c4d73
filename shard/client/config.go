package client

import (
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
)

// Config configures a Client. Start from DefaultConfig: a zero field of a
// Config that did not come from it is an error, not a default.
type Config struct {
	// Addrs are nodes to ask first (client addresses, host:port); the
	// client learns the rest of the cluster from them.
	Addrs []string
	// ClientID identifies this client's pushes for deduplication; 0 (the
	// default, and the safe choice) draws a random one. An ID must never be
	// reused by another Client instance, at the same time or later (a
	// restarted process included): every Client numbers its pushes from seq
	// 1 again, so the nodes would take the new pushes for retries of the
	// old ones and drop them as duplicates. Push returns ErrClientIDReused
	// when it sees that happen.
	ClientID uint64
	// RetryTimeout bounds how long one call keeps retrying through leader
	// changes when its context has no earlier deadline.
	RetryTimeout time.Duration
	// AttemptTimeout bounds one call to one node within those retries, so
	// a node that stopped answering without closing its connection costs
	// one attempt, not the whole RetryTimeout. A timed-out push is retried
	// with the same seq, so it is still applied at most once.
	AttemptTimeout time.Duration
	// SuspectAfter: a call not answered this long makes the client ask two
	// other nodes, every SuspectAfter/3 after that, when they last heard
	// from the node it waits for. If one has not for SuspectSilence (a live
	// node is heard from several times per Raft heartbeat interval), the
	// node is taken for dead or cut off and the call is abandoned as if its
	// attempt had timed out, outcome unknown. Without it a client waits out
	// AttemptTimeout on a dead machine, which does not refuse connections.
	// Negative turns the asking off.
	SuspectAfter   time.Duration
	SuspectSilence time.Duration
	// MaxMessageBytes caps a message the client sends or receives.
	MaxMessageBytes int
	// MaxCallBytes bounds the rows of one call: a push whose gradients,
	// or a pull whose rows, take more is sent as several calls of at most
	// this many bytes, one after another (each shard's part of each still
	// applied exactly once; the whole is not atomic, as a push over
	// several shards never is). The default is half of a node's default
	// limit on a client's message (16 MiB, raftps server
	// --max-message-bytes), so a wide table's large batches pass.
	MaxCallBytes int
	// HedgeAfter is the least time a read that other replicas may serve
	// (bounded, eventual, hot keys, chain reads) waits for one node before
	// it is also sent to the next (hedge.go): the threshold is the 90th
	// percentile of recent such reads, at least this. HedgeBudget is the
	// share of such reads that may be hedged. Negative HedgeAfter or zero
	// HedgeBudget turns hedging off.
	HedgeAfter  time.Duration
	HedgeBudget float64
	// DialOptions are added to every connection's options (after the
	// client's own, so they win): transport credentials, interceptors. By
	// default connections are plaintext.
	DialOptions []grpc.DialOption
	// Metrics, if set, gets the client's metrics (raftps_client_*): its
	// pulls and pushes by table and outcome, their latency and rows.
	// Clients of one process may share a registry.
	Metrics prometheus.Registerer
}

// Defaults of a Config.
const (
	DefaultRetryTimeout    = 30 * time.Second
	DefaultAttemptTimeout  = 10 * time.Second
	DefaultSuspectAfter    = 150 * time.Millisecond
	DefaultSuspectSilence  = 250 * time.Millisecond
	DefaultMaxMessageBytes = 64 << 20
	DefaultMaxCallBytes    = 8 << 20
)

// DefaultConfig returns the configuration of a client of the nodes at addrs
// with every default filled in.
func DefaultConfig(addrs ...string) Config {
	return Config{
		Addrs:           addrs,
		RetryTimeout:    DefaultRetryTimeout,
		AttemptTimeout:  DefaultAttemptTimeout,
		SuspectAfter:    DefaultSuspectAfter,
		SuspectSilence:  DefaultSuspectSilence,
		MaxMessageBytes: DefaultMaxMessageBytes,
		MaxCallBytes:    DefaultMaxCallBytes,
		HedgeAfter:      DefaultHedgeAfter,
		HedgeBudget:     DefaultHedgeBudget,
	}
}

// Validate reports what is wrong with the configuration, naming each field
// and value at fault.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if len(c.Addrs) == 0 {
		bad("Addrs is empty: the client needs at least one node's address")
	}
	for _, a := range c.Addrs {
		if a == "" {
			bad("Addrs holds an empty address")
		}
	}
	if c.RetryTimeout <= 0 {
		bad("RetryTimeout (%s) must be positive", c.RetryTimeout)
	}
	if c.AttemptTimeout <= 0 {
		bad("AttemptTimeout (%s) must be positive", c.AttemptTimeout)
	}
	if c.SuspectAfter >= 0 {
		if c.SuspectAfter == 0 {
			bad("SuspectAfter is 0: give a duration, or a negative one to turn suspicion off")
		}
		if c.SuspectSilence <= 0 {
			bad("SuspectSilence (%s) must be positive while SuspectAfter (%s) is on", c.SuspectSilence, c.SuspectAfter)
		}
	}
	if c.HedgeAfter == 0 {
		bad("HedgeAfter is 0: give a duration, or a negative one to turn hedging off")
	}
	if c.HedgeBudget < 0 || c.HedgeBudget > 1 {
		bad("HedgeBudget (%v) must be within 0..1", c.HedgeBudget)
	}
	if c.MaxMessageBytes <= 0 {
		bad("MaxMessageBytes (%d) must be positive", c.MaxMessageBytes)
	}
	if c.MaxCallBytes <= 0 {
		bad("MaxCallBytes (%d) must be positive", c.MaxCallBytes)
	}
	if len(errs) > 0 {
		return fmt.Errorf("raftps client config: %w", errors.Join(errs...))
	}
	return nil
}
