// Package localcluster runs a raftps cluster of separate server processes
// on one machine, all its state in one directory: what raftps cluster, the
// demo, the local chaos target and the binary tests use.
//
//	DIR/cluster.json   the nodes and the arguments each server runs with
//	DIR/addrs          comma-separated client addresses (for --cluster)
//	DIR/nK/data/       node K's data
//	DIR/nK/pid         node K's process ID while it runs
//	DIR/nK/log         node K's output
//
// Up starts the first nodes as a static cluster (--peers); Add starts one
// more that joins it (--join). Node K listens for clients on base+K-1 and
// serves HTTP on base+100+K-1; its gossip and peer addresses are the
// server's defaults (ports +1000 and +2000, shard.DefaultGossipAddr and
// shard.DefaultPeerAddr).
//
// Servers run in sessions of their own, so they outlive the process that
// started them; the state file is how a later process (raftps cluster
// kill, restart, down) finds them. A Cluster value's fault injection
// (faults.go) is safe for concurrent use; the rest is not, and one process
// at a time should change a directory's cluster.
//
// proc*.go tie processes' lives together: Exited watches a process (a
// server started with --stop-with-pid stops when its parent test ends),
// DieWithParent makes a child get SIGTERM when its parent dies (the
// trainers raftps train --trainers starts).
package localcluster
