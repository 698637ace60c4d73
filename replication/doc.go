// Package replication replicates shards by Raft, and holds the core that
// chain replication (package replication/chain) shares with it. A Group is
// one replica of one shard of a table: a hashicorp/raft instance with a
// raft-boltdb/v2 log and stable store and a file snapshot store under its
// directory, whose FSM is the shard's store.Table plus a record of applied
// (client, seq) pairs.
//
// # Push path
//
//  1. Group.Push (leader only) validates the push (client and seq non-zero,
//     dim, finite gradients, size) and queues it, encoded, in the group's
//     Batcher.
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
// in 1 MiB chunks. Closing a group's Transport ends its calls in flight, so
// that raft's Shutdown, which waits for the replicators making them, does
// not wait out a timeout on a peer that does not answer.
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
//
// # The core chains share
//
// A chain replica (package replication/chain) differs from a Group in how
// its log is ordered and replicated, not in what an entry is or does. It
// uses, from this package:
//
//   - FSM (NewFSM): the replicated state, a store.Table plus the dedupe
//     record. ApplyCommand applies one entry's command and returns its
//     ApplyResult; SetApplied advances the applied index; Snapshot and
//     Restore capture and replace the state (a Snapshot streams with
//     WriteTo). Changes are made one at a time; Table and AppliedIndex read
//     from any goroutine.
//   - Batcher (NewBatcher): group commit. Check validates a push, Submit
//     queues it and waits for its outcome, Next takes a Batch for one entry
//     once an in-flight slot is free; the owner appends the Batch's command
//     (AppendCommand) to its log and answers it (Answer with the entry's
//     ApplyResult, or Fail), which frees the slot.
//   - Push, the command format (PushedKeys lists a command's keys;
//     KeysBytes and ValuesBytes are the byte views commands and chain
//     messages carry), DedupeWindow and DefaultDedupeTTL.
//   - The sentinel errors ErrBadRequest, ErrUnknownOutcome, ErrGroupClosed
//     and ErrSequenceTooOld, ErrTransportClosed and ErrGroupExists; and
//     ServerOptions and PeerDialOptions, the gRPC options of a node's peer
//     port and of its connections to peers.
package replication
