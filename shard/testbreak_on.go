//go:build raftps_testbreak

package shard

import "os"

// Deliberate bugs, for proving that the chaos checkers catch real ones
// (test/chaos_test.go builds a binary with the raftps_testbreak tag for
// them; no other build has them). RAFTPS_TEST_BREAK, read once at start,
// names one; a server that has one logs it loudly.
//
//   - follower-linearizable: followers serve linearizable pulls from what
//     they have applied, without a read index (the client of such a build
//     spreads linearizable pulls over the replicas): a pull can miss a push
//     acknowledged before it began.
//   - drop-acked-push: every 50th push a node receives is acknowledged
//     without being applied.
var testBreak = os.Getenv("RAFTPS_TEST_BREAK")

const (
	breakFollowerLinearizable = "follower-linearizable"
	breakDropAckedPush        = "drop-acked-push"
)
