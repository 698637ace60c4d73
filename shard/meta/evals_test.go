package meta

import (
	"errors"
	"math"
	"testing"

	"github.com/raftps/raftps/shard/api"
	"github.com/raftps/raftps/shard/shardpb"
)

func evalReq(job string, step uint64, auc float64) *shardpb.ReportEvalRequest {
	return &shardpb.ReportEvalRequest{Job: job, Point: &shardpb.EvalPoint{Step: step, Auc: auc, Logloss: 0.5, BayesAuc: 0.8, BayesLogloss: 0.4}}
}

func steps(m *FSM, job string) []uint64 {
	for _, e := range m.Evals() {
		if e.Job == job {
			var out []uint64
			for _, p := range e.Points {
				out = append(out, p.Step)
			}
			return out
		}
	}
	return nil
}

// A job's curve stays ordered by step: a resumed job's earlier step
// replaces the points from it on; it is capped at MaxEvalPoints, keeps
// across a snapshot, and goes with the job.
func TestReportEvalCurve(t *testing.T) {
	l := newMetaLog(t)
	for _, s := range []uint64{10, 20, 30} {
		if out := l.apply(CmdReportEval, evalReq("j", s, 0.7)); out != nil {
			t.Fatalf("report of step %d: %v", s, out)
		}
	}
	l.apply(CmdReportEval, evalReq("j", 20, 0.75))
	if got := steps(l.m, "j"); len(got) != 2 || got[0] != 10 || got[1] != 20 {
		t.Fatalf("after a resumed job reported step 20 again: steps %v, want [10 20]", got)
	}
	for s := uint64(100); s < 100+MaxEvalPoints+10; s++ {
		l.apply(CmdReportEval, evalReq("k", s, 0.6))
	}
	if got := steps(l.m, "k"); len(got) != MaxEvalPoints || got[0] != 110 {
		t.Fatalf("%d points from step %v, want the last %d", len(got), got[:1], MaxEvalPoints)
	}

	other := New(func() {})
	if err := restore(other, snapshotBytes(t, l.m)); err != nil {
		t.Fatal(err)
	}
	if got := steps(other, "j"); len(got) != 2 {
		t.Fatalf("after restoring a snapshot: steps %v", got)
	}

	l.join("j", 1, 0, "127.0.0.1:1")
	l.apply(CmdDeleteJob, &shardpb.DeleteJobRequest{Job: "j"})
	if got := steps(l.m, "j"); got != nil {
		t.Fatalf("a deleted job keeps its curve: %v", got)
	}
}

// Bad reports are refused and change nothing.
func TestReportEvalRefusesBadPoints(t *testing.T) {
	l := newMetaLog(t)
	l.apply(CmdReportEval, evalReq("j", 10, 0.7))
	for name, req := range map[string]*shardpb.ReportEvalRequest{
		"no point":  {Job: "j"},
		"step 0":    evalReq("j", 0, 0.7),
		"NaN AUC":   evalReq("j", 11, math.NaN()),
		"Inf AUC":   evalReq("j", 11, math.Inf(1)),
		"no job":    evalReq("", 11, 0.7),
		"long name": evalReq(string(make([]byte, api.MaxJobNameLen+1)), 11, 0.7),
	} {
		err, _ := l.apply(CmdReportEval, req).(error)
		if !errors.Is(err, api.ErrBadRequest) && !errors.Is(err, api.ErrNonFinite) {
			t.Errorf("%s: applied with %v, want a refusal", name, err)
		}
	}
	if got := steps(l.m, "j"); len(got) != 1 {
		t.Fatalf("refused reports changed the curve: %v", got)
	}
}
