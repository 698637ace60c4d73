// Package replication replicates shards. A Group is one replica of one shard
// of a table: a hashicorp/raft instance with a raft-boltdb/v2 log and stable
// store and a file snapshot store under its directory, whose FSM is the
// shard's store.Table plus a record of applied (client, seq) pairs.
//
// # Push path
//
//  1. Group.Push (leader only) validates the push (client and seq non-zero,
//     dim, finite gradients, size) and queues it, encoded.
//  2. One batcher goroutine per group turns queued pushes into log entries:
//     group commit. At most MaxInflight entries are uncommitted at once; pushes
//     that arrive meanwhile go out together in the next entry (up to
//     MaxEntryBytes). The entry carries the leader's clock.
//  3. Every replica's FSM applies the entry's pushes in order, each as its own
//     store.Apply (so each push is one optimizer step, exactly as on one
//     node), skipping any (client, seq) it has applied: a sliding window of
//     DedupeWindow seqs per client, kept in snapshots, so retries and
//     out-of-order completions from one client are applied at most once.
//  4. The leader answers each push with its outcome once the entry is applied.
//     A push that met a leader change or timed out has an unknown outcome
//     (ErrUnknownOutcome): the client retries it with the same (client, seq).
//
// # Reads
//
// Group.Pull with linearizable set is a read-index read on the leader (see the
// argument on Pull); otherwise any replica answers from what it has applied.
//
// # Transport
//
// Mux is a node's one Raft transport: every group's messages travel over the
// node's gRPC server, each tagged with its group ID, over one connection per
// peer (keepalive 2 s). Appends are unary or pipelined on a stream per group
// and peer; heartbeats are handed to the group's heartbeat handler directly
// and coalesced per peer when several groups send at once; snapshots stream
// in 1 MiB chunks.
//
// # Concurrency
//
// Push, Pull and the accessors are safe for concurrent use. Raft calls the
// FSM's Apply, Snapshot and Restore one at a time on its FSM goroutine; a
// snapshot is persisted on another goroutine while applies go on (store's
// copy-on-write snapshots make that safe). Readers reach the table through an
// atomic pointer that Restore swaps. Close stops the group's goroutines and
// Raft; pushes still queued fail with ErrGroupClosed, and pushes whose entry
// raft dropped at shutdown fail with ErrUnknownOutcome (raft may leave such a
// future unanswered; the group never waits on one past Close).
//
// # Determinism
//
// Everything the FSM does depends only on the log: dedupe expiry uses the
// leader time written into each entry, never a replica's clock.
package replication
