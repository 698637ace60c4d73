// Package meta is the state machine of the metadata group: the Raft group
// over the cluster's nodes (3 or 5 voters, the rest non-voters) that every
// node replicates and the metadata leader proposes to.
//
// # What it owns
//
//   - FSM (New): a raft.FSM whose state is the table specs, the trainer job
//     registry and the cluster map, changed only by the commands it applies
//     (CmdCreateTable ... CmdAlterTable, CmdDropTable, CmdJoinJobV2,
//     CmdSetClusterID, CmdReportEval, CmdPutToken, CmdDeleteToken, each a
//     type byte and a deterministic proto, Encode), in log order on every
//     replica. Apply's answer is what the proposer
//     returns to its caller; a refused command answers an error and changes
//     nothing. Snapshot writes format 3; Restore reads formats 1 to 3, whole
//     (no size cap: see meta.go).
//   - Lifecycle and quotas (lifecycle.go): dropping a table, the quotas on
//     tables, replicas per node and jobs that the proposing leader puts in
//     its command and Apply checks, and the cluster's ID, chosen once by
//     the first CmdSetClusterID. Table names, node IDs and addresses are
//     checked again on apply (api.CheckTableName, CheckNode).
//   - The cluster map (clustermap.go): nodes with addresses and admin state,
//     and per shard its replica set, the node being added and an epoch,
//     changed by compare-and-set on the epoch (CmdSetShard). ClusterMap,
//     ShardMap, Node and the other readers return its entries.
//   - The job registry (jobs.go): the rendezvous of a training job's
//     trainers. Each registers its collective address with a join and waits
//     until all world ranks of its round are there (JobComplete); a
//     newcomer to a complete round starts the next round, and the old
//     round's trainers join again. Joins are metadata log entries, applied in
//     commit order, so ranks are assigned alike on every replica and the
//     registry survives the loss of any minority of nodes.
//   - Bearer tokens' records (tokens.go): ID, name, role and the hash of
//     the secret, never the secret. The FSM is the node's auth.TokenStore
//     (Token), read by the client gate on every call that presents a
//     token.
//
// What it does not own: proposing (the node's applyMeta, in package shard,
// encodes a command and applies it through the metadata group's Raft), the
// decisions (the node's scheduler, with package placement), and the read
// index (the node's metaReadIndex, which waits for Processed).
//
// # Determinism
//
// Apply must compute the same state and the same answer on every replica
// from the same log: what it stores, and whether it refuses a command (with
// which sentinel error), depend on nothing but the log (no clock, no
// randomness; lists are sorted by name or key before they are stored or
// written), and a snapshot of the same state is the same bytes on every
// replica. The command values and the snapshot formats are in
// every existing log and snapshot: they never change; a new command gets a
// new value, and old ones are still applied so that old logs replay.
//
// # Concurrency
//
// Raft calls Apply, Snapshot, Restore and StoreConfiguration one at a time,
// on its FSM goroutine. The readers may be called from any goroutine: they
// take the FSM's RWMutex. Stored values (specs, jobs, nodes, shard entries)
// are never modified, only replaced, so readers may keep and send them
// without copying, and must not modify them. The onChange callback runs on
// the FSM goroutine after each change of the tables or the map, and must not
// block. Processed is an atomic.
package meta
