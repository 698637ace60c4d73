// Package shard is the cluster layer of raftps: the node process, the
// metadata group, the gRPC service and the client.
//
// # What it owns
//
//   - Node (StartNode): one raftps server. It listens on one gRPC port that
//     carries the client API (shardpb.ParameterServer), every Raft group's
//     traffic (replication.Mux), every chain's (chain.Mux) and
//     server reflection; it serves /healthz and
//     /debug/pprof on an optional HTTP port.
//   - The metadata group: a Raft group over the same nodes (3 or 5 voters,
//     the rest non-voters) whose FSM (meta.go) holds the table specs, the
//     trainer job registry and the cluster map (clustermap.go): nodes with
//     addresses and admin state, and per shard its replica set, the node
//     being added and an epoch, changed by compare-and-set.
//   - The scheduler (scheduler.go), on the metadata leader only: places
//     tables with Place, repairs nodes dead longer than the repair grace,
//     rebalances after joins and drains, one idempotent step per shard at a
//     time, carried out by the shard's leader (reconfigure.go: a non-voter
//     catches up before it votes; removal after replacement).
//   - Chain tables (TableSpec replication "chain", fixed at creation):
//     each shard is a chain.Chain instead of a Raft group. Its
//     order is the map entry's replica list, head first, and its epoch the
//     entry's epoch; the scheduler changes it only by removing a member
//     (survivors keep their order) or appending one at the tail, one change
//     per epoch, and removes a member as soon as the metadata leader has not
//     heard from its node for the chain silence, gossip declares it dead, or
//     its node reports it broken (chainsched.go, scheduler.silentNodes,
//     ReportBroken). Reconcile opens the chain replicas the map places on
//     the node (under DataDir/chains), hands each SetConfig(epoch, member
//     addresses) when its entry changes, and closes and deletes one the map
//     moves away (chainnode.go). Pushes go to the head (elsewhere refused
//     with a NotLeader detail naming the head); pulls are served by any
//     member: linearizable and bounded by CRAQ after the member confirms
//     its epoch with the metadata leader (chainconfirm.go), eventual from
//     local state. Status reports each chain replica's role, epoch, order
//     and checksum.
//   - Every node's reconcile loop (reconcile.go): registers the node in the
//     map, opens and closes replicas as the map says, deletes moved-away
//     data once the group's leader confirms, and hands leadership to each
//     shard's preferred leader.
//   - Membership (membership.go): every node runs a hashicorp/memberlist on
//     its gossip address and tracks each node's liveness (alive, suspect,
//     dead) from its events; Status reports it with per-node replica and
//     leader counts and the number of under-replicated shards; the scheduler
//     acts on it. Its transport (gossiptransport.go) is memberlist's, with
//     dials and dialed streams that end at shutdown and, with fault
//     injection, the blocked set applied.
//   - Placement (placement.go): Place, a pure and deterministic function from
//     the live nodes, the tables' shard and replica counts and the current
//     map to each shard's ordered replica set (first = preferred leader):
//     rendezvous hashing, then a bounded-load correction so that no node
//     holds more than ceil(S·R/N) replicas or ceil(S/N)+1 leaders, keeping
//     every current replica that fits so a join or leave moves about 1/N of
//     them, and raising a node below floor(S·R/N) replicas or floor(S/N)
//     leaders (one that just joined) to its share.
//   - The job registry (jobs.go): the rendezvous of a training job's
//     trainers. Each registers its collective address with JoinJob and
//     waits (Client.WaitJob) until all world ranks of its round are there; a
//     newcomer to a complete round starts the next round, and the old
//     round's trainers join again. Joins are metadata log entries, applied in
//     commit order, so ranks are assigned alike on every replica and the
//     registry survives the loss of any minority of nodes.
//   - Consistency levels (consistency.go): linearizable pulls by the leader;
//     bounded pulls by any replica whose read lease (a read index it asked
//     the leader for, then applied) is younger than the bound; eventual
//     pulls by any replica not cut off. AlterTable changes a table's level.
//     Per-node served-pull counters by role and level.
//   - Hot keys (hot.go): per-shard space-saving counts of pulled keys,
//     reported to the shard leader (a chain's head) once a window; the
//     leader's hot set and its read replicas outside the replica set, which
//     copy the hot rows by linearizable reads and serve bounded and
//     eventual pulls of them.
//   - service: thin handlers. Each checks the request, calls the node or the
//     shard's replication.Group, and converts the error with toStatus, the one
//     table from sentinel errors to gRPC codes (errors.go). A request a
//     follower cannot serve is refused with FailedPrecondition and a NotLeader
//     detail naming the leader; job registry calls are forwarded to the
//     metadata leader instead (onMetaLeader), one hop at most.
//   - Client: dials any node, learns table specs, each shard's replicas and
//     epoch (refreshed when a node says the client's map is stale) and shard
//     leaders, splits a
//     batch by shard (api.ShardOf: a stable hash of the key), sends one
//     PullBatch or PushBatch per node that leads some of them (bounded and
//     eventual pulls, and every pull of a chain table: per node ranked
//     first for some of them, see clientspread.go; a chain's head is its
//     leader) (a part the
//     node cannot serve falls back to a per-shard call), puts rows back in
//     the caller's order, and retries through leader changes with the same
//     (client, seq), so a push whose outcome was unknown is applied at most
//     once.
//
// # Concurrency
//
// Node and Client methods are safe for concurrent use. A node's sets of open
// groups and chains are guarded by Node.mu and only reconcileLoop adds to
// them or closes their members; its retired and lastTransfer maps are reconcileLoop's alone. The
// scheduler runs on one goroutine and starts one goroutine per shard step,
// tracked in scheduler.inflight under scheduler.mu; its steps' context ends
// when the node stops leading the metadata group. The
// metadata FSM is applied on Raft's FSM goroutine; readers take its RWMutex.
// The client's connection, leader and hot-set caches are guarded by
// Client.mu; per group sequence numbers are atomics.
//
// Read leases: one per group (Node.leases under leaseMu), each with its own
// mutex; at most one renewal runs per lease, and reads wait on its channel.
// Hot keys: Node.hot.mu guards the maps of trackers, leader views and read
// replicas, read-locked on the pull path; a tracker's sketch and a read
// replica's rows have their own mutexes, taken after hot.mu when both are. hotLoop is the only goroutine that closes windows; each read
// replica has one refresh goroutine, stopped by closing its stop channel
// under hot.mu. Served counters are atomics.
//
// Chain epoch confirmations and metadata barriers go through coalescers
// (chainconfirm.go): at most one run in flight each, on a goroutine started
// with Node.spawn; callers that arrive during a run share the next. The
// metadata leader's broken-replica reports are under brokenReports.mu.
package shard
