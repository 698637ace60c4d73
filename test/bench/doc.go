// Package bench is the load generator of raftps bench: clients that pull
// and push Zipf-distributed batches against a cluster for a while, and the
// rows/s and latency they saw. docs/BENCHMARKS.md's cluster numbers come
// from it.
//
// Run starts one goroutine per client and one progress ticker, all ended
// before it returns.
package bench
