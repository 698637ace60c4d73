package chaos

import (
	"testing"
	"time"

	"github.com/raftps/raftps/test/history"
)

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

// TestMaxLatency: the slowest completed call of the workload's clients;
// probes (client -1) and failed or unknown calls do not count.
func TestMaxLatency(t *testing.T) {
	ms := int64(time.Millisecond)
	ops := []history.Op{
		{Client: 0, Kind: history.Push, Outcome: history.OK, Call: 0, Return: 300 * ms},
		{Client: 1, Kind: history.Push, Outcome: history.OK, Call: 100 * ms, Return: 2100 * ms},
		{Client: -1, Kind: history.Push, Outcome: history.OK, Call: 0, Return: 5000 * ms},
		{Client: 2, Kind: history.Push, Outcome: history.Unknown, Call: 0, Return: 9000 * ms},
		{Client: 0, Kind: history.Pull, Outcome: history.OK, Call: 0, Return: 40 * ms},
	}
	if got := maxLatency(ops, history.Push); got != 2000 {
		t.Errorf("slowest push %d ms, want 2000", got)
	}
	if got := maxLatency(ops, history.Pull); got != 40 {
		t.Errorf("slowest pull %d ms, want 40", got)
	}
	if got := maxLatency(ops[2:4], history.Push); got != -1 {
		t.Errorf("slowest push of probes and unknown outcomes %d ms, want -1 (none)", got)
	}
}
