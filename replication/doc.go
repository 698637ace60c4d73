// Package replication replicates shards by Raft, and holds the core that
// chain replication (package replication/chain) shares with it. A Group is
// one replica of one shard of a table: a hashicorp/raft instance whose log
// and stable store are a raft-boltdb/v2 file of its own or, if its node
// runs one (RaftConfig.NodeLog), its part of the node's NodeLog (one bbolt
// file for all the node's shard replicas, group-committed), with a file snapshot store under its directory, whose FSM is the
// shard's store.Table plus a record of applied (client, seq) pairs.
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
//     An entry that does not decode whole (checked before any of it is
//     applied: command type, counts bounded by the bytes present, each push
//     whole at the table's dim) is refused whole with ErrBadEntry, alike on
//     every replica: nothing of it is applied and its pushes fail with it.
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
// and peer, in a binary encoding (appendcodec.go) to peers whose answers
// say they read it and msgpack to others, as every other message; heartbeats
// are handed to the group's heartbeat handler directly
// and coalesced per peer (raft's periodic ones wait up to HeartbeatDelay
// for others); snapshots stream in 1 MiB chunks. So that idle groups cost
// little (transport_idle.go), the Mux pings every peer it has not heard
// from lately, keeping LastHeard a measure of node liveness, and a
// group's transport answers an idle append identical to one the follower
// accepted lately from that answer instead of sending it. A group whose log
// stands still goes quiet (transport_quiet.go, RaftConfig.QuietAfter): its
// replicas reload raft's heartbeat and election timeouts to seconds, agreed
// through a timing word on the leader's heartbeats, and its failover is left
// to ExpediteElection. A shard group quiet for RaftConfig.DormantAfter more
// goes dormant (transport_dormant.go): its leader steps down and no replica
// runs a timer; Push, ReadIndex and Awaken wake it with an election.
// Closing a group's Transport ends its calls in flight, so
// that raft's Shutdown, which waits for the replicators making them, does
// not wait out a timeout on a peer that does not answer.
//
// # Concurrency
//
// Push, Pull and the accessors are safe for concurrent use; Tick, Awaken
// (concurrent calls start one election) and TransferLeadership too (a group's quiescence has a mutex of its own, and
// reloads raft's timing only under it). Raft calls the FSM's Apply,
// Snapshot and Restore one at a time on its FSM goroutine; a snapshot is
// persisted on another goroutine while applies go on (store's
// copy-on-write snapshots make that safe). Readers reach the table through an
// atomic pointer that Restore swaps. Close stops the group's goroutines and
// Raft; pushes still queued fail with ErrGroupClosed, and pushes whose entry
// raft dropped at shutdown fail with ErrUnknownOutcome (raft may leave such a
// future unanswered; the group never waits on one past Close).
//
// # Bad files and a full disk
//
// OpenRaft (and a chain's Open) checks a replica's files before trusting
// them (CheckBoltFile: bolt pages read by pread, never mapped; a CRC-32C
// on every log entry, checkedLogs; the snapshot stores' CRCs) and contains
// what opening does (Contain: faults become panics, panics errors): a
// replica that fails is ErrCorruptReplica, for its node to set aside, never
// a dead process. A Mux with MuxConfig.Space refuses appends with entries
// and snapshots that do not fit while the disk is full (admitWrite), and
// RaftConfig.OnNoSpace lets a term or vote write that found the disk full
// free the node's reserve and try again (spaceStable).
//
// # The segment log
//
// A SegLog (the shard replicas' default) is one replica's log in
// append-only segment files: a StoreLogs is one pwrite and one fdatasync
// under its mutex, reads are preads under a read lock. A failed fdatasync
// makes it refuse every later call until reopened. See SegLog.
//
// # The shared log
//
// A NodeLog's writer goroutine commits every write queued when it starts a
// transaction, of any number of replicas, in one bbolt transaction (group
// commit, no timer); writers wait for their commit. Each replica's records
// sit in a bucket named by a log ID recorded in its directory, so a
// deleted or set-aside directory takes its records with it (Sweep deletes
// them) and a replica opened in its place starts empty. See NodeLog.
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
//   - The sentinel errors ErrBadRequest, ErrUnknownOutcome, ErrGroupClosed,
//     ErrBadEntry and ErrSequenceTooOld, ErrTransportClosed and
//     ErrGroupExists; and
//     ServerOptions and PeerDialOptions, the gRPC options of a node's peer
//     port and of its connections to peers.
package replication
