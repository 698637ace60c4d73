package trainer

import (
	"cmp"
	"math"
)

// Summary is a trainer's result for people and scripts (raftps train
// --json): of the job on trainer 0, with the other trainers' examples
// added in; of the trainer on the others.
type Summary struct {
	Job          string   `json:"job"`
	Model        string   `json:"model"`
	Table        string   `json:"table"`
	Mode         string   `json:"mode"`
	Rank         int      `json:"rank"`
	Trainers     int      `json:"trainers"`
	FirstStep    int      `json:"first_step"`
	Steps        int      `json:"steps"`
	Examples     int      `json:"examples"`
	Late         int      `json:"late_steps"`
	WallS        float64  `json:"wall_s"`
	ExamplesPerS float64  `json:"examples_per_s"`
	FinalAUC     float64  `json:"final_auc"`
	BayesAUC     Optional `json:"bayes_auc"`
	FinalLogLoss float64  `json:"final_logloss"`
	BayesLogLoss Optional `json:"bayes_logloss"`
	// TimeToTarget is the training time (evaluations excluded) until
	// the held-out AUC first came within 0.01 of the Bayes-optimal one;
	// null if it never did or the Bayes-optimal AUC is unknown.
	TimeToTarget Optional `json:"time_to_target_s"`
	Pull         Latency  `json:"pull"`
	Push         Latency  `json:"push"`
	Evals        []Eval   `json:"evals"`
}

// Summarize is res of the job of cfg as a Summary; with the other
// trainers' summaries, the examples and examples/s are the job's.
func Summarize(tc JobConfig, res *Result, others []Summary) Summary {
	out := Summary{Job: tc.Job, Model: tc.Model, Table: cmp.Or(tc.Table, tc.Job), Mode: res.Mode, Rank: res.Rank, Trainers: res.World,
		FirstStep: res.FirstStep, Steps: res.Steps, Examples: res.Samples, Late: res.Late, WallS: res.Seconds, ExamplesPerS: res.SamplesPerS,
		Pull: res.Pull, Push: res.Push, Evals: res.Evals, BayesAUC: Optional(math.NaN()), BayesLogLoss: Optional(math.NaN()),
		TimeToTarget: Optional(math.NaN())}
	for _, e := range res.Evals {
		if e.AUC >= float64(e.BayesAUC)-0.01 {
			out.TimeToTarget = Optional(e.Seconds)
			break
		}
	}
	for _, o := range others {
		out.Examples += o.Examples
		out.ExamplesPerS += o.ExamplesPerS
	}
	if len(res.Evals) > 0 {
		last := res.Evals[len(res.Evals)-1]
		out.FinalAUC, out.FinalLogLoss, out.BayesAUC, out.BayesLogLoss = last.AUC, last.LogLoss, last.BayesAUC, last.BayesLogLoss
	}
	return out
}
