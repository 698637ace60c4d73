// Package netfault is network fault injection for tests of clusters whose
// nodes share one host (raftps cluster up): they all talk over 127.0.0.1,
// where neither docker network disconnect nor a firewall rule can cut one
// node off, nor tc netem slow one down.
//
// # What it owns
//
// Faults, one per node started with NodeConfig.FaultInjection (package
// shard), shared by the node's peer dialers (Raft and chain transports) and
// its gossip transport (package membership). The node serves it at
// /debug/netfault on its HTTP port (Faults.ServeHTTP); in-process tests use
// Node.BlockPeers and Node.SetDelay, which call Block and SetDelay.
//
//   - Partitions: while a node is told to block a set of peer addresses
//     (gRPC and gossip), its own dialers act as if those peers were
//     unreachable: connections to them are closed, new ones hang until
//     their dial timeout (as a connect into a partition does, ErrBlackholed),
//     gossip packets to them are dropped and gossip packets from them
//     ignored. A partition is made by telling every node on each side to
//     block the other side; since every connection is dialed by one of its
//     two ends, that cuts traffic both ways. Clients (which do not dial
//     through a node) still reach every node: the cut-off leader stays
//     reachable, which is the harder case for linearizable reads.
//   - Slow nodes: with a delay set, every unary call the node answers (on
//     both listeners, UnaryServer) and every unary call it makes to a peer
//     (UnaryClient) is that much late: a node that answers, but late, whose
//     heartbeats arrive late and whose leases run out, as on a real slow
//     machine.
//   - ConnSet: open connections by the address they were dialed to, closed
//     together; Faults keeps the ones Dial opened, the gossip transport its
//     own streams.
//
// Off by default: it is a test facility, like a failpoint build. A node
// without fault injection has no Faults (nil) and none of these hooks.
//
// # Concurrency
//
// Faults and ConnSet are safe for concurrent use. Block closes the
// connections to newly blocked peers after the new set is in place; a dial
// that raced with it checks the set again after adding its connection to the
// ConnSet, so no connection to a blocked peer survives (see ConnSet).
package netfault
