// Package membership is a node's gossip view of the cluster: which nodes are
// alive, suspect or dead.
//
// # What it owns
//
// Every node runs a hashicorp/memberlist on its gossip address (New) and
// tracks each node's liveness (Alive, Suspect, Dead) from its events;
// Members reports it, with what each node last gossiped about itself (its
// client address, cluster map version and leader count, SetLocal, and the
// features of its build, Local.Features, which older builds neither send nor
// read). The node
// (package shard) reports it in Status with per-node replica and leader
// counts, and its scheduler acts on it: repairs, chain removals, hot-key
// read replicas.
//
// memberlist has no event for suspicion: a node alive by gossip is shown
// Suspect once it has left this node's probes unanswered for longer than
// memberlist's round-robin probing allows. A node expected (Local.Expect:
// the node's static peers) or in the cluster map (SetKnown) but never heard
// from is Dead, and is joined again every RejoinInterval, since memberlist
// never probes a node it declared dead again.
//
// Its transport (gossiptransport.go) is memberlist's, with dials and dialed
// streams that end at shutdown and, with fault injection (Local.Faults,
// package netfault), the blocked set applied.
//
// It knows nothing of the node's address layout: the node hands it the
// gossip address to bind and the gossip addresses to join (Config), derived
// from its own conventions (shard.DefaultGossipAddr, shard.GossipAddrOfPeer)
// when not given.
//
// # Concurrency
//
// Membership's methods are safe for concurrent use; SetLocal must not be
// called from a memberlist delegate. memberlist calls the delegates from its
// own goroutines, some with its node lock held: they copy what they need
// under Membership.mu and never call memberlist. New starts one goroutine,
// the rejoin loop; Close stops it, leaves the cluster and shuts memberlist
// and its transport down, without waiting for a join held up by a peer that
// never answers.
package membership
