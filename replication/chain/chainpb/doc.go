// Package chainpb is generated from chain.proto: the gRPC service between
// the members of a chain-replicated shard (Replicate: a predecessor streams
// log entries, or a snapshot first, to its successor, and acknowledgements
// flow back; Read: CRAQ reads of dirty keys at the tail). Edit the .proto
// file and run make proto.
//
// Messages are not safe for concurrent modification; the generated stubs
// are safe for concurrent use.
package chainpb
