// Package chain replicates shards by chain replication (van Renesse and
// Schneider) with CRAQ reads. A Chain is one replica of a chain-replicated
// shard: the same replicated state (replication.FSM: store table plus
// dedupe record), the same command format and the same group commit
// (replication.Batcher) as a Raft group, but the log is ordered by a chain
// of members, head → ... → tail, that the meta group decides and hands
// every member with SetConfig(epoch, order). Epochs only grow; a member
// refuses every message of another epoch than its own (ErrStaleEpoch if
// older, ErrEpochAhead if newer: it must not act on an order it has not been
// given) and a stream from anyone but its predecessor.
//
// # Push path
//
//  1. Chain.Push (head only, else *NotHeadError) validates as a Raft group's
//     Push does and queues the push; the head's batcher makes one entry of
//     the pushes waiting (group commit, at most MaxInflight uncommitted
//     entries), stamped with the head's clock and its epoch, at the next
//     index.
//  2. Every member persists each entry (bbolt, fsync) before it applies it
//     and before it passes it on, then applies it through
//     replication.FSM.ApplyCommand, then forwards it to its successor on a
//     stream (pipelined: entries are sent as they are appended, without
//     waiting for acks).
//  3. The tail commits what it applies and acks its committed index
//     upstream on the same stream; each member records it and acks its own
//     predecessor; the head answers a push when its entry is committed. A
//     push answered duplicate is answered at the commit of its new entry too.
//  4. A reconfiguration fails the pushes a replaced head had waiting with
//     replication.ErrUnknownOutcome; retried at the new head with the same
//     (client, seq), each is applied at most once (the dedupe record is
//     replicated state).
//
// # Protocol
//
// Package chainpb: a predecessor opens Replicate to its successor once
// per epoch. Hello: the predecessor's group, address, epoch and commit
// floor; the successor answers with its last applied index i and the epoch
// entry i was created in. If the predecessor's log holds the same (i, epoch)
// and the entries after it, it sends a resume message (first index i+1, no
// entries) and streams from i+1; otherwise (the successor is new, behind the
// predecessor's compacted log, or holds entries the predecessor lacks) it
// first streams a snapshot of its state (FSM snapshot: index, dedupe record,
// table) in 1 MiB chunks, which replaces the successor's state and log. The
// resume message or the installed snapshot settles the handshake: the
// successor is then synced in this epoch, its log a prefix of its
// predecessor's. Until then (after a new epoch or a restart) a non-head
// member's log may end in entries the chain never committed, e.g. a removed
// head's leftovers when it is appended again, so it counts nothing more as
// committed (a tail does not commit what it applied, and recovery only
// trusts the committed index recorded with the appends), acks nothing new,
// serves no ReadLinearizable or ReadCRAQ read nor another member's Read, and
// opens no stream to its own successor. Invariants: only the head of an
// epoch creates entries, so (index, creation epoch) names one entry; entries
// enter a log only in order after a matched handshake or a snapshot, so
// equal (index, epoch) means equal logs up to there; and so, while the meta
// group keeps surviving members in order and appends new ones at the tail,
// every member's log is a prefix of its predecessor's once synced. Hence an
// entry a synced tail applied is on every member, a removed tail's successor
// role goes to a member holding all it had, and a new tail, once synced, can
// commit everything it applied.
//
// # Reads
//
// Chain.Pull: ReadLinearizable at the tail only, once its predecessor's
// stream of this epoch has settled its log (synced) and it has applied the
// commit floor that predecessor reported (a new or rejoined member serves
// nothing stale or uncommitted); ReadCRAQ anywhere: keys no
// applied-but-uncommitted entry touches come from local state, the others
// from the tail (Read RPC, checked against the tail's epoch); ReadAny: local
// state plus the committed index.
//
// # Storage
//
// Dir: chain.db holds the log (index → entry), epoch, order, committed index
// and the current snapshot's index; snapshot-<index> files hold FSM
// snapshots. Every SnapshotEvery entries a snapshot is written and the
// entries at or below both it and the committed index are deleted. Open
// restores the snapshot and replays the log after it. A storage error stops
// the replica (ErrReplicaBroken): pushes fail, entries are refused, nothing
// is acknowledged that was not persisted.
//
// # Concurrency
//
// Goroutines of a Chain, all ended by Close (or by SetConfig, for the
// stream ones): the batcher (head: queued pushes to entries); the snapshot
// writer; a sender per epoch with a successor (it waits until its member is
// synced), with an ack reader per stream; per inbound stream, the gRPC
// handler (which sends acks) and a receiver that persists and applies what
// arrives. Locks, in the order they nest: snapMu (writing or installing
// snapshots), applyMu (log appends, applies, snapshots taken, installs,
// configuration changes: it is what keeps the FSM's changes one at a time),
// mu (configuration, commit index, the in-memory entry cache, waiting
// pushes, streams), dirtyMu (the per-key counts of uncommitted entries, for
// CRAQ).
//
// # Transport
//
// Mux is a node's one chain transport: it serves every chain replica's RPCs
// on the node's gRPC server (with replication.ServerOptions) and holds one
// client connection per peer (replication.PeerDialOptions); messages are
// routed by group ID.
package chain
