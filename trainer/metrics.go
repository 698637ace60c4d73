package trainer

import (
	"fmt"
	"math"
	"slices"
)

// AUC returns the area under the ROC curve of scores against labels (a label
// is positive when it is not 0): the probability that a random positive scores
// higher than a random negative, ties counting one half. It is exact: samples
// are sorted by score and tied scores share their average rank
// (Mann-Whitney U). It returns NaN when there are no positives or no
// negatives, or when a score is NaN. It panics if the lengths differ.
func AUC(labels []float32, scores []float64) float64 {
	if len(labels) != len(scores) {
		panic(fmt.Sprintf("trainer: AUC of %d labels and %d scores", len(labels), len(scores)))
	}
	idx := make([]int32, len(scores))
	for i := range idx {
		if math.IsNaN(scores[i]) {
			return math.NaN()
		}
		idx[i] = int32(i)
	}
	slices.SortFunc(idx, func(a, b int32) int {
		sa, sb := scores[a], scores[b]
		switch {
		case sa < sb:
			return -1
		case sa > sb:
			return 1
		}
		return 0
	})
	var pos, neg float64
	var rankSum float64 // sum of the (1-based, tie-averaged) ranks of positives
	for i := 0; i < len(idx); {
		j := i
		var p float64
		for ; j < len(idx) && scores[idx[j]] == scores[idx[i]]; j++ {
			if labels[idx[j]] != 0 {
				p++
			}
		}
		// ranks i+1 .. j share their average
		avg := float64(i+1+j) / 2
		rankSum += p * avg
		pos += p
		neg += float64(j-i) - p
		i = j
	}
	if pos == 0 || neg == 0 {
		return math.NaN()
	}
	return (rankSum - pos*(pos+1)/2) / (pos * neg)
}

// LogLossEps bounds the probabilities LogLoss takes a logarithm of: p is
// clamped to [LogLossEps, 1-LogLossEps], so one confident mistake costs at
// most -log(LogLossEps) ≈ 34.5.
const LogLossEps = 1e-15

// LogLoss returns the mean binary cross-entropy of probabilities probs
// against labels (a label is positive when it is not 0), in nats. It returns
// NaN for no samples or a NaN probability, and panics if the lengths differ.
func LogLoss(labels []float32, probs []float64) float64 {
	if len(labels) != len(probs) {
		panic(fmt.Sprintf("trainer: LogLoss of %d labels and %d probabilities", len(labels), len(probs)))
	}
	if len(labels) == 0 {
		return math.NaN()
	}
	var sum float64
	for i, p := range probs {
		p = math.Min(math.Max(p, LogLossEps), 1-LogLossEps) // NaN stays NaN
		if labels[i] != 0 {
			sum -= math.Log(p)
		} else {
			sum -= math.Log1p(-p)
		}
	}
	return sum / float64(len(labels))
}

// BayesMetrics returns the AUC and logloss of the true probabilities of
// samples (Sample.Prob): the best any model can do on them. Both are NaN when
// a probability is unknown.
func BayesMetrics(samples []Sample) (auc, logloss float64) {
	labels := make([]float32, len(samples))
	probs := make([]float64, len(samples))
	for i := range samples {
		labels[i] = samples[i].Label
		probs[i] = samples[i].Prob
	}
	return AUC(labels, probs), LogLoss(labels, probs)
}
