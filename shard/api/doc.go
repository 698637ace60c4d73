// Package api is what raftps clients and servers agree on, apart from the
// protobuf messages themselves (package shardpb): the key → shard function,
// the packed wire encoding of keys and rows, table spec validation and
// defaults, the job registry's limits, and the errors a node answers with,
// each named by a stable reason carried in the status details.
//
// It is a leaf: it imports shardpb, store (for the initializer and optimizer
// grammars) and gRPC's status types, and nothing of Raft, bolt or
// memberlist, so the Go client (shard/client) can depend on it.
//
// Everything here is part of the wire contract between versions: a change
// to ShardOf, to a reason's spelling or to the meaning of a default breaks
// mixed clusters and clients. It holds no state; every function is safe for
// concurrent use.
package api
