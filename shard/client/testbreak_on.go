//go:build raftps_testbreak

package client

import "os"

// spreadLinearizable: with RAFTPS_TEST_BREAK=follower-linearizable in a
// binary built with the raftps_testbreak tag, linearizable pulls are spread
// over the replicas like eventual ones, so that followers can serve them
// (their side of the bug is the node's). The chaos tests prove with it that
// the linearizability checker catches a real bug; no release build has it.
var spreadLinearizable = os.Getenv("RAFTPS_TEST_BREAK") == "follower-linearizable"
