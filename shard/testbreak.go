package shard

import "os"

// Deliberate bugs, for proving that the chaos checkers catch real ones
// (test/chaos_test.go). RAFTPS_TEST_BREAK, read once at start by servers
// and clients, names one; a server that has one logs it loudly. Never set
// it on a cluster whose data matters.
//
//   - follower-linearizable: linearizable pulls are spread over the
//     replicas like eventual ones, and followers serve them from what they
//     have applied, without a read index: a pull can miss a push
//     acknowledged before it began.
//   - drop-acked-push: every 50th push a node receives is acknowledged
//     without being applied.
var testBreak = os.Getenv("RAFTPS_TEST_BREAK")

const (
	breakFollowerLinearizable = "follower-linearizable"
	breakDropAckedPush        = "drop-acked-push"
)
