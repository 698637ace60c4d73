// Package demo is raftps demo: what raftps is for, on one machine. It starts
// a 3-node cluster of separate processes (package localcluster), trains the
// DLRM-like model on it with synchronous trainers, SIGKILLs the leader of a
// shard half-way through, restarts it, and proves with a counter table
// that every acknowledged push is there exactly once. Run starts the
// cluster's processes, the trainers and two pushing goroutines, and stops
// them all before it returns (unless told to keep the cluster).
package demo
