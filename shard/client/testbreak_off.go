//go:build !raftps_testbreak

package client

// spreadLinearizable is a deliberate bug of test builds (testbreak_on.go);
// in every other build it is false, and the branches it guards compile away.
const spreadLinearizable = false
