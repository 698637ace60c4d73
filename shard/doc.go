// Package shard is the cluster layer of raftps: the node process, the
// metadata group, the gRPC service and the client.
//
// # What it owns
//
//   - Node (StartNode): one raftps server. It listens on one gRPC port that
//     carries the client API (shardpb.ParameterServer), every Raft group's
//     traffic (replication.Mux) and server reflection; it serves /healthz and
//     /debug/pprof on an optional HTTP port.
//   - The metadata group: a Raft group over the same nodes whose FSM (meta.go)
//     holds the table specs and the trainer job registry. Every node opens a
//     replica of every shard of every table it finds there (reconcileLoop).
//     The cluster is static for now: --peers lists every node and every node
//     holds every shard.
//   - Membership (membership.go): every node runs a hashicorp/memberlist on
//     its gossip address and tracks each node's liveness (alive, suspect,
//     dead) from its events; Status reports it with per-node replica and
//     leader counts and the number of under-replicated shards. It informs
//     only: placement does not act on it yet.
//   - Placement (placement.go): Place, a pure and deterministic function from
//     the live nodes, the tables' shard and replica counts and the current
//     map to each shard's ordered replica set (first = preferred leader):
//     rendezvous hashing, then a bounded-load correction so that no node
//     holds more than ceil(S·R/N) replicas or ceil(S/N)+1 leaders, keeping
//     every current replica that fits so a join or leave moves about 1/N of
//     them. It is a building block of the elastic cluster and is not wired
//     into the node yet: every node still holds every shard.
//   - The job registry (jobs.go): the rendezvous of a training job's
//     trainers. Each registers its collective address with JoinJob and
//     waits (Client.WaitJob) until all world ranks of its round are there; a
//     newcomer to a complete round starts the next round, and the old
//     round's trainers join again. Joins are metadata log entries, applied in
//     commit order, so ranks are assigned alike on every replica and the
//     registry survives the loss of any minority of nodes.
//   - service: thin handlers. Each checks the request, calls the node or the
//     shard's replication.Group, and converts the error with toStatus, the one
//     table from sentinel errors to gRPC codes (errors.go). A request a
//     follower cannot serve is refused with FailedPrecondition and a NotLeader
//     detail naming the leader; job registry calls are forwarded to the
//     metadata leader instead (onMetaLeader), one hop at most.
//   - Client: dials any node, learns table specs and shard leaders, splits a
//     batch by shard (ShardOf: a stable hash of the key), sends one
//     PullBatch or PushBatch per node that leads some of them (a part the
//     node cannot serve falls back to a per-shard call), puts rows back in
//     the caller's order, and retries through leader changes with the same
//     (client, seq), so a push whose outcome was unknown is applied at most
//     once.
//
// # Concurrency
//
// Node and Client methods are safe for concurrent use. A node's set of open
// groups is guarded by Node.mu and only reconcileLoop adds to it. The
// metadata FSM is applied on Raft's FSM goroutine; readers take its RWMutex.
// The client's connection and leader caches are guarded by Client.mu; per
// group sequence numbers are atomics.
package shard
