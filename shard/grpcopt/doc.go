// Package grpcopt holds the gRPC settings every raftps connection shares:
// buffer sizes and flow-control windows sized for messages of a megabyte
// (a 4096-row push or pull answer, a Raft AppendEntries of such pushes), and
// a buffer pool that does not clear what it hands out.
//
// It is a leaf with no raftps imports, so the client package and the Raft
// and chain transports (replication) take the same
// settings without linking each other.
//
// Concurrency: the pool is safe for concurrent use (one sync.Pool per size);
// Install must run before any gRPC connection or server is created.
package grpcopt
