package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestChaosFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "--target is required"},
		{[]string{"--target", "nowhere"}, "want local:DIR"},
		{[]string{"--target", "ftp:x"}, "unknown kind"},
		{[]string{"--target", "local:/nonexistent/raftps"}, "cluster.json"},
		{[]string{"--target", "local:x", "--faults", "kill-leader,flood"}, `unknown fault "flood"`},
		{[]string{"--target", "local:x", "--down", "10s", "--every", "10s"}, "must be shorter than --every"},
		{[]string{"--target", "local:x", "--clients", "0"}, "must be positive"},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(append([]string{"chaos"}, tc.args...), &stdout, &stderr); code != 1 || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("chaos %v: exit %d, stderr %q; want exit 1 and %q", tc.args, code, stderr.String(), tc.want)
		}
	}
}

func TestChaosFaultSummary(t *testing.T) {
	faults := []chaosFault{
		{Kind: "kill-leader", UnavailableMs: 400, ReplicatedMs: 3000},
		{Kind: "kill-leader", UnavailableMs: 600, ReplicatedMs: -1},
		{Kind: "kill-leader", UnavailableMs: 500, ReplicatedMs: 2000},
		{Kind: "kill-leader", UnavailableMs: -1},
		{Kind: "pause-leader", UnavailableMs: 900, Error: "healing n2: boom"},
	}
	got := summarizeFaults(faults)
	if len(got) != 2 {
		t.Fatalf("summary %+v", got)
	}
	k := got[0]
	if k.Kind != "kill-leader" || k.Count != 4 || k.Failed != 1 || k.P50Ms != 500 || k.P99Ms != 600 || k.MaxMs != 600 || k.RepP50Ms != 2000 {
		t.Errorf("kill-leader summary %+v", k)
	}
	if p := got[1]; p.Count != 1 || p.Failed != 1 || p.P50Ms != -1 {
		t.Errorf("pause-leader summary %+v", p)
	}
	if q := quantile([]int64{5, 1, 3}, 0.5); q != 3 {
		t.Errorf("median of 5,1,3 = %d", q)
	}
}

func TestChaosTableSpec(t *testing.T) {
	if s := chaosTableSpec("chaos_bnd"); s.StalenessBoundNs == 0 || s.Optimizer != "sgd:lr=1" {
		t.Errorf("bounded spec %v", s)
	}
	if s := chaosTableSpec("x_evt"); s.Consistency.String() != "CONSISTENCY_EVENTUAL" {
		t.Errorf("eventual spec %v", s)
	}
	if s := chaosTableSpec("plain"); s.Consistency != 0 || s.Initializer != "zeros" || s.HotThreshold != 0 {
		t.Errorf("default spec %v", s)
	}
	if s := chaosTableSpec("chaos_chn_bnd_hot"); s.Replication != "chain" || s.StalenessBoundNs == 0 || s.HotThreshold <= 0 || s.HotReplicas == 0 {
		t.Errorf("hot bounded chain spec %v", s)
	}
}
