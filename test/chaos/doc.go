// Package chaos is raftps's fault injector and checker: a workload of
// pushes and pulls whose every acknowledged push can be accounted for (SGD
// with lr=1, small positive integer gradients on a zero table), faults
// injected into a cluster while it runs (kills, pauses and partitions of
// leaders, minorities, majorities; node deaths), then heal, convergence and
// the verdicts: nothing lost or doubled, the linearizable tables' histories
// linearizable (porcupine), the bounded tables' pulls within their bound,
// every shard's replicas equal. raftps chaos, make test's chaos rounds and
// make soak run it.
//
// A Target is a cluster it can hurt: a local cluster of processes
// (package localcluster; partitions through each node's /debug/netfault)
// or a docker compose project (docker kill, pause, network disconnect).
//
// Run uses the client package like any user and the target's commands; it
// runs one goroutine per workload client and per probe, all ended before it
// returns. A Report is plain data, the JSON that raftps chaos --json prints.
package chaos
