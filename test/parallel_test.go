package test

import "testing"

// waitsMostly marks a test that spends most of its wall time waiting
// (elections, gossip timeouts, repair, processes starting) rather than
// computing: measured over a run of the package, each used under half a
// core of the two. Such tests run beside each other and beside the chaos
// tests (go test's -parallel, GOMAXPROCS by default), which took about a
// minute off the package on a 2-core host. Tests whose assertions depend on
// rates or lease timing (hot keys, bounded reads) and the CPU-bound ones
// (training, elastic repair) stay serial. Under the race detector, which
// multiplies every test's CPU, all run serially.
func waitsMostly(t *testing.T) {
	t.Helper()
	if !raceDetector {
		t.Parallel()
	}
}
