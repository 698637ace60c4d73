package meta

import (
	"fmt"
	"math"

	"github.com/raftps/raftps/shard/api"
	"github.com/raftps/raftps/shard/shardpb"
	"google.golang.org/protobuf/proto"
)

// CmdReportEval records one evaluation of a job (a *shardpb.ReportEvalRequest).
// Numbered apart from the commands above, which other work extends.
const CmdReportEval byte = 20

// MaxEvalPoints is how many evaluations a job keeps: the latest. A job
// evaluates a few dozen times, so this is its whole curve in practice, and
// the metadata state stays small whatever a trainer reports.
const MaxEvalPoints = 256

// CheckReportEval refuses what the state machine would: a bad job name, a
// missing point, step 0, or values that are not finite (an AUC of an empty
// set is NaN: nothing to draw).
func CheckReportEval(req *shardpb.ReportEvalRequest) error {
	if err := api.CheckJobName(req.GetJob()); err != nil {
		return err
	}
	p := req.GetPoint()
	switch {
	case p == nil:
		return fmt.Errorf("%w: evaluation report without a point", api.ErrBadRequest)
	case p.Step == 0:
		return fmt.Errorf("%w: evaluation of step 0", api.ErrBadRequest)
	}
	for _, v := range []float64{p.Seconds, p.Auc, p.Logloss, p.BayesAuc, p.BayesLogloss} {
		if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
			return fmt.Errorf("%w: evaluation of step %d holds %v", api.ErrNonFinite, p.Step, v)
		}
	}
	return nil
}

// applyReportEval appends the point to its job's curve. A step at or
// before the curve's last is a resumed job evaluating again: the points
// from that step on are replaced, so the curve stays ordered by step.
func (m *FSM) applyReportEval(arg []byte) any {
	req := &shardpb.ReportEvalRequest{}
	if err := proto.Unmarshal(arg, req); err != nil {
		return fmt.Errorf("meta: decoding evaluation report: %w", err)
	}
	if err := CheckReportEval(req); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.evals == nil {
		m.evals = map[string]*shardpb.JobEvals{}
	}
	old := m.evals[req.Job]
	var pts []*shardpb.EvalPoint
	if old != nil {
		for _, p := range old.Points {
			if p.Step < req.Point.Step {
				pts = append(pts, p)
			}
		}
	}
	pts = append(pts, req.Point)
	if len(pts) > MaxEvalPoints {
		pts = pts[len(pts)-MaxEvalPoints:]
	}
	// Replaced, never modified: readers may keep what Evals returned.
	m.evals[req.Job] = &shardpb.JobEvals{Job: req.Job, Points: pts}
	return nil
}

// Evals returns every job's evaluation curve, by job name (not to be
// modified).
func (m *FSM) Evals() []*shardpb.JobEvals {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return sortedByName(m.evals)
}

func evalsByJob(list []*shardpb.JobEvals) map[string]*shardpb.JobEvals {
	out := make(map[string]*shardpb.JobEvals, len(list))
	for _, e := range list {
		out[e.Job] = e
	}
	return out
}
