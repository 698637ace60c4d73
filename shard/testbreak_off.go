//go:build !raftps_testbreak

package shard

// testBreak names a deliberate bug of test builds (testbreak_on.go); in
// every other build it is empty, and the branches it guards compile away.
const testBreak = ""

const (
	breakFollowerLinearizable = "follower-linearizable"
	breakDropAckedPush        = "drop-acked-push"
)
