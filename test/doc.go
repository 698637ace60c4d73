// Package test holds the tests that span packages and their harnesses:
//
//   - an in-process cluster (StartCluster: real shard.Nodes on loopback,
//     each with its own data dir, Raft groups, client and peer gRPC servers
//     and memberlist), which tests kill, restart, cut off and grow;
//   - clusters of the real binary (raftps cluster up, in the _test files),
//     whose processes tests SIGKILL, SIGSTOP and partition through
//     --fault-injection, and raftps chaos runs against them (every binary
//     they build is a test build, -tags raftps_faultinject: buildBinaryTags);
//   - test/history, the recorder and checkers of client histories.
//
// The Docker compose round is not here: make test-docker runs raftps chaos
// against the containers.
//
// Concurrency: most tests run one after another, as their timing (failover,
// rates, leases) assumes the CPU. The ones that mostly wait say so
// (waitsMostly) and run in parallel, except under the race detector. Binary
// clusters get port runs below the kernel's ephemeral range that no other
// test of the binary holds, and their servers stop with the test binary
// (--stop-with-pid), even when go test's timeout kills it. Training tests
// run their clusters without fsync (TrainRaft, --unsafe-no-fsync): their
// subject is training, and a killed process loses nothing either way.
package test
