package test

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/raftps/raftps/test/chaos"
)

// runChaos runs raftps chaos on a local cluster and returns its summary and
// exit status.
func runChaos(t *testing.T, bin, dir string, args ...string) (chaos.Report, int) {
	t.Helper()
	return runChaosEnv(t, nil, bin, dir, args...)
}

// runChaosEnv is runChaos with extra environment variables.
func runChaosEnv(t *testing.T, env []string, bin, dir string, args ...string) (chaos.Report, int) {
	t.Helper()
	out := filepath.Join(t.TempDir(), "chaos")
	cmd := exec.Command(bin, append([]string{"chaos", "--target", "local:" + dir, "--json", "--out", out}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	stdout, err := cmd.Output()
	code := 0
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
		t.Logf("chaos progress:\n%s", ee.Stderr)
	case err != nil:
		t.Fatalf("raftps chaos: %v", err)
	}
	var s chaos.Report
	if err := json.Unmarshal(stdout, &s); err != nil {
		t.Fatalf("raftps chaos --json printed %q: %v", stdout, err)
	}
	return s, code
}

// TestBinaryChaosLocal is make test's short chaos round: a 3-process
// cluster, a checked workload on a linearizable, a bounded and a chain
// (linearizable) table, a leader kill, a leader pause (SIGSTOP longer than
// an election), a leader cut off from the other nodes (fault injection:
// clients still reach it, so a stale leader serving linearizable reads
// would show) and a majority cut off (no quorum anywhere until the heal).
// Every verdict must pass: nothing lost or doubled, the linearizable
// history linearizable, bounded pulls within their bound, replicas equal,
// writes back within a few seconds of each fault, and the bounded table's
// reads answered through every single-node fault (chaos fails a run whose
// read window is over a second; every fault must report one per table with
// readers). The idle table has no workload: its groups are quiet when a
// fault hits their leader, and the probe's push to them must come back
// (the majority cut hits every group, so at least that fault measures it).
func TestBinaryChaosLocal(t *testing.T) {
	// Beside TestBinaryPausedLeaderNoAttemptTimeout, which mostly waits.
	t.Parallel()
	bin, dir, _ := binaryCluster(t, fastTimeouts, "--fault-injection")
	s, code := runChaos(t, bin, dir, "--duration", "32s", "--every", "8s", "--down", "2500ms", "--faults", "kill-leader,pause-leader,partition-leader,partition-majority", "--tables", "chaos_lin,chaos_bnd,chaos_chn,chaos_idl")
	t.Logf("chaos: %d faults, %d acked, %d unknown, linearizable %v, staleness %v, checksums equal %v",
		len(s.Faults), s.Acked, s.Unknown, deref(s.Linearizable), deref(s.Staleness), s.ChecksumsEqual)
	if code != 0 || len(s.Violations) > 0 {
		t.Fatalf("chaos failed (exit %d): %v", code, s.Violations)
	}
	if len(s.Faults) != 4 {
		t.Errorf("%d faults injected, want 4 (one of each kind)", len(s.Faults))
	}
	idleHit := 0
	for _, f := range s.Faults {
		t.Logf("  %s %s: writes back after %d ms (idle tables %d ms), read windows %v ms, read p99 %v ms", f.Kind, f.Node, f.UnavailableMs, f.IdleUnavailableMs, f.ReadWindowMs, f.ReadP99Ms)
		if f.IdleUnavailableMs >= 0 {
			idleHit++
			if f.IdleUnavailableMs > 5000 {
				t.Errorf("fault %s on %s: the idle table's writes came back after %d ms", f.Kind, f.Node, f.IdleUnavailableMs)
			}
		}
		if f.UnavailableMs < 0 || f.UnavailableMs > 5000 || f.Error != "" {
			t.Errorf("fault %s on %s: unavailable %d ms, error %q", f.Kind, f.Node, f.UnavailableMs, f.Error)
		}
		if len(f.ReadWindowMs) != 3 || len(f.ReadP99Ms) != 3 {
			t.Errorf("fault %s on %s: read windows %v and p99 %v, want one per table", f.Kind, f.Node, f.ReadWindowMs, f.ReadP99Ms)
		}
	}
	if idleHit == 0 {
		t.Error("no fault measured the idle table's writes")
	}
	if s.Acked < 200 || s.Lost != 0 || s.Doubled != 0 || s.Linearizable == nil || !*s.Linearizable ||
		s.Staleness == nil || !*s.Staleness || !s.ChecksumsEqual {
		t.Errorf("summary %+v", s)
	}
}

// TestBinaryChaosCatchesBrokenBuilds runs chaos against servers with a
// deliberate bug (RAFTPS_TEST_BREAK, read only by binaries built with the
// raftps_testbreak tag) and checks that it fails, and for the right reason: acknowledged pushes that were never applied show up as
// lost; linearizable pulls served by followers without a read index show
// up as a non-linearizable history.
func TestBinaryChaosCatchesBrokenBuilds(t *testing.T) {
	for _, tc := range []struct {
		brk  string
		want func(chaos.Report) bool
	}{
		{"drop-acked-push", func(s chaos.Report) bool { return s.Lost > 0 }},
		{"follower-linearizable", func(s chaos.Report) bool { return s.Linearizable != nil && !*s.Linearizable }},
	} {
		t.Run(tc.brk, func(t *testing.T) {
			// Both clusters at once: each is small, and make test's time is
			// budgeted. The break travels in the environment of the servers
			// (cluster up) and of chaos's clients.
			t.Parallel()
			env := []string{"RAFTPS_TEST_BREAK=" + tc.brk}
			bin, dir, _ := binaryClusterBuilt(t, buildBinaryTags(t, "raftps_testbreak"), env, fastTimeouts)
			s, code := runChaosEnv(t, env, bin, dir, "--duration", "14s", "--every", "10s", "--down", "2s", "--faults", "kill-leader", "--tables", "chaos_lin")
			t.Logf("exit %d, lost %d, linearizable %v, violations %d", code, s.Lost, deref(s.Linearizable), len(s.Violations))
			if code == 0 || len(s.Violations) == 0 || !tc.want(s) {
				t.Fatalf("chaos did not catch %s: exit %d, summary %+v", tc.brk, code, s)
			}
		})
	}
}

func deref(b *bool) any {
	if b == nil {
		return nil
	}
	return *b
}
