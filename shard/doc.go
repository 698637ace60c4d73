// Package shard is the raftps node: one server process's wiring and its
// request paths. The parts with a job of their own live in packages below
// it, with small interfaces between them:
//
//   - shard/meta: the metadata group's state machine (meta.FSM): table
//     specs, the trainer job registry and the cluster map.
//   - shard/placement: placement.Place, the pure function from live nodes
//     and tables to each shard's ordered replica set.
//   - shard/membership: gossip liveness (hashicorp/memberlist).
//   - shard/netfault: network fault injection (partitions, slow nodes)
//     for tests of clusters on one host.
//   - shard/api: what client and server agree on (key → shard, spec
//     checks, error reasons); shard/client: the Go client users import,
//     which depends on no server code; shard/shardpb: the protocol.
//
// # What it owns
//
//   - Node (StartNode): one raftps server. It listens on two gRPC ports:
//     the client API (shardpb.ParameterServer and server reflection) on
//     Addr, and the peer API on PeerAddr: every Raft group's traffic
//     (replication.Mux), every chain's (chain.Mux) and the node-to-node
//     calls (shardpb.Peer: peer.go and the features' own handlers). Both
//     servers run recoverOptions first (recover.go): a handler that panics
//     answers Internal and logs one line with its stack; the node lives. It
//     serves /healthz (and /debug/pprof with NodeConfig.Pprof,
//     httpdebug.go) on an optional HTTP port, and /debug/netfault with
//     NodeConfig.FaultInjection (faults.go) in test builds only
//     (netfault_http_on.go, -tags raftps_faultinject).
//   - Who may call what (security.go, peerauth.go): the gates of both
//     listeners (shard/auth, with NodeConfig.Certs or Insecure), the node
//     credentials it dials peers with, and the checks of every peer
//     message against the sender's certificate and its groups: the Raft
//     and chain transports' Authorize hooks and an interceptor for the
//     Peer service. They read the cluster map and the groups' Raft
//     configurations only, on the calls' goroutines.
//   - Its address conventions (addrs.go): the peer and gossip addresses a
//     node derives from its client address (DefaultPeerAddr,
//     DefaultGossipAddr, GossipAddrOfPeer), and the gossip address and
//     join list it hands membership when the config leaves them out.
//   - The metadata group: a Raft group over the same nodes (3 or 5 voters,
//     the rest non-voters) whose FSM is a meta.FSM. The node proposes to it
//     on the metadata leader (applyMeta), forwards the calls only that
//     leader may serve (onMetaLeader, one hop at most), and answers reads
//     that must see every committed change after a read index
//     (metaAuthoritative, metaReadIndex in chainconfirm.go).
//   - The scheduler (scheduler.go), on the metadata leader only: places
//     tables with placement.Place, repairs nodes dead longer than the
//     repair grace, rebalances after joins and drains, one idempotent step
//     per shard at a time, carried out by the shard's leader
//     (reconfigure.go: a non-voter catches up before it votes; removal after
//     replacement). It keeps the metadata group at 3 or 5 voters, and
//     forgets removed nodes that hold nothing (admin.go: join, drain,
//     remove).
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
//     with reason NOT_LEADER naming the head); pulls are served by any
//     member: linearizable and bounded by CRAQ after the member confirms
//     its epoch with the metadata leader (chainconfirm.go), eventual from
//     local state. Status reports each chain replica's role, epoch, order
//     and checksum.
//   - Every node's reconcile loop (reconcile.go): registers the node in the
//     map, opens and closes replicas as the map says, deletes moved-away
//     data once the group's leader confirms, hands leadership to each
//     shard's preferred leader, and tells membership the map's nodes and
//     this node's map version and leader count.
//   - Liveness: the node runs a membership.Membership and acts on its view;
//     Status reports it with per-node replica and leader counts and the
//     number of under-replicated shards.
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
//   - service and peerService: thin handlers. Each checks the request,
//     calls the node or the shard's replication.Group, and converts the
//     error with toStatus, the one table from sentinel errors to gRPC codes
//     (errors.go): every error status carries an ErrorInfo detail with its
//     reason (api.Reason). A request a follower cannot serve is refused with
//     FailedPrecondition and reason NOT_LEADER, the ErrorInfo naming the
//     leader by its client address; calls only the metadata leader may
//     serve (job registry, AlterTable, node admin) are forwarded to it
//     instead (onMetaLeader), one hop at most. PeerContact tells a client when this node last heard from
//     another (peercontact.go).
//   - Admission limits (limits.go): both listeners' server options in
//     one function (Node.serverOptions: receive and send limits,
//     MaxConcurrentStreams, the shard/internal/admission codec that
//     refuses a message of too many repeated elements before decoding
//     it), parts per batch, one answer budget per Pull or PullBatch
//     checked before rows are allocated, batch parts served BatchWorkers
//     at a time, and Status checksums read at most once per
//     ChecksumInterval (checksums.go).
//
// The client (shard/client) dials any node, routes each key by the shard
// map and the shards' leaders, and retries with the same (client, seq) so
// that a push whose outcome was unknown is applied at most once; see its
// package documentation.
//
// # Concurrency
//
// Node methods are safe for concurrent use. A node's sets of open
// groups and chains are guarded by Node.mu and only reconcileLoop adds to
// them or closes their members; its retired and lastTransfer maps are
// reconcileLoop's alone. The scheduler runs on one goroutine and starts one
// goroutine per shard step, tracked in scheduler.inflight under
// scheduler.mu; its steps' context ends when the node stops leading the
// metadata group. The metadata FSM is applied on Raft's FSM goroutine; its
// readers may run on any (see package meta). Membership and the fault
// injection are safe for concurrent use (see their packages).
//
// Read leases: one per group (Node.leases under leaseMu), each with its own
// mutex; at most one renewal runs per lease, and reads wait on its channel.
// Hot keys: Node.hot.mu guards the maps of trackers, leader views and read
// replicas, read-locked on the pull path; a tracker's sketch and a read
// replica's rows have their own mutexes, taken after hot.mu when both are.
// hotLoop is the only goroutine that closes windows; each read replica has
// one refresh goroutine, stopped by closing its stop channel under hot.mu.
// Served counters are atomics. Status's checksum passes run one at a
// time under checksumCache.mu's rule (checksums.go): callers that arrive
// during a pass wait for it, later ones within the interval share it.
//
// Chain epoch confirmations and metadata barriers go through coalescers
// (chainconfirm.go): at most one run in flight each, on a goroutine started
// with Node.spawn; callers that arrive during a run share the next. The
// metadata leader's broken-replica reports are under brokenReports.mu, the
// node's own set-aside replicas under setAsideSet.mu.
//
// A pull answer's rows (answercodec.go) come from gRPC's buffer pool and
// belong to the client listener's codec once the handler returns them:
// gRPC returns them to the pool after writing them, so nothing may keep a
// PullResponse's Values after returning it.
//
// Bad files and a full disk (setaside.go, disk.go, docs/RELIABILITY.md): a
// replica whose files fail their checks at open is set aside (moved under
// DataDir/set-aside), reported to the metadata leader, removed from its
// shard and rebuilt from its peers as a repair; the node serves its other
// replicas. The node's disk guard (package diskguard) refuses pushes with
// reason DISK_FULL, and its transports refuse entries and oversized
// snapshots, while the data disk is below its minimum free space.
package shard
