package chaos

import "testing"

func TestFaultSummary(t *testing.T) {
	faults := []Fault{
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

func TestTableSpec(t *testing.T) {
	if s := TableSpec("chaos_bnd"); s.Consistency.String() != "bounded:100ms" || s.Optimizer != "sgd:lr=1" {
		t.Errorf("bounded spec %+v", s)
	}
	if s := TableSpec("x_evt"); s.Consistency.String() != "eventual" {
		t.Errorf("eventual spec %+v", s)
	}
	if s := TableSpec("plain"); s.Consistency.Level != 0 || s.Initializer != "zeros" || s.HotThreshold != 0 {
		t.Errorf("default spec %+v", s)
	}
	if s := TableSpec("chaos_chn_bnd_hot"); s.Replication != "chain" || s.Consistency.Bound == 0 || s.HotThreshold <= 0 || s.HotReplicas == 0 {
		t.Errorf("hot bounded chain spec %+v", s)
	}
}
