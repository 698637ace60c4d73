// Package reptest holds what the tests of Raft groups (package
// replication) and of chain replicas (replication/chain) share: a table
// whose rows are exact sums, and a workload that checks them.
//
// It imports no replication package, so that package replication's own
// tests can use it; pushes go in and out as keys and gradients.
//
// A Workload is safe for concurrent use (one mutex): many clients'
// goroutines acknowledge pushes to one workload, each drawing rows from its
// own rand.Rand.
package reptest
