package trainer

import (
	"math"
	"testing"
)

func TestAUC(t *testing.T) {
	for _, tc := range []struct {
		name   string
		labels []float32
		scores []float64
		want   float64
	}{
		{"perfect", []float32{0, 0, 1, 1}, []float64{0.1, 0.2, 0.8, 0.9}, 1},
		{"reversed", []float32{1, 1, 0, 0}, []float64{0.1, 0.2, 0.8, 0.9}, 0},
		// pairs (pos, neg): (0.35 vs 0.1) win, (0.35 vs 0.4) lose, (0.8 vs both) win: 3/4
		{"classic", []float32{0, 1, 0, 1}, []float64{0.1, 0.35, 0.4, 0.8}, 0.75},
		{"all tied", []float32{0, 1, 0, 1}, []float64{0.5, 0.5, 0.5, 0.5}, 0.5},
		// pos 0.5 vs neg 0.5: 1/2; pos 0.5 vs neg 0.2: 1; pos 0.9 vs both: 2 -> 3.5/4
		{"one tie", []float32{1, 0, 0, 1}, []float64{0.5, 0.5, 0.2, 0.9}, 0.875},
		// ranks: 0.1->1, 0.3 x3 -> 3, 0.7->5; positives at 3 and 5: (8-3)/(2*3)
		{"tie group", []float32{0, 1, 0, 0, 1}, []float64{0.1, 0.3, 0.3, 0.3, 0.7}, 5.0 / 6},
		{"positive is any nonzero", []float32{0, 2}, []float64{0, 1}, 1},
	} {
		if got := AUC(tc.labels, tc.scores); !(math.Abs(got-tc.want) <= 1e-12) {
			t.Errorf("%s: AUC = %v, want %v", tc.name, got, tc.want)
		}
	}
	for _, tc := range []struct {
		name   string
		labels []float32
		scores []float64
	}{
		{"empty", nil, nil},
		{"all positive", []float32{1, 1}, []float64{0.2, 0.3}},
		{"all negative", []float32{0, 0}, []float64{0.2, 0.3}},
		{"NaN score", []float32{0, 1}, []float64{0.2, math.NaN()}},
	} {
		if got := AUC(tc.labels, tc.scores); !math.IsNaN(got) {
			t.Errorf("%s: AUC = %v, want NaN", tc.name, got)
		}
	}
}

// TestAUCBruteForce compares AUC with the pairwise definition on scores with
// many ties.
func TestAUCBruteForce(t *testing.T) {
	s, _ := NewSynthetic(SyntheticConfig{Seed: 9, Fields: 2, Vocab: 5, ZipfS: 1, WeightStd: 1})
	samples := s.Samples(0, 500)
	labels := make([]float32, len(samples))
	scores := make([]float64, len(samples))
	for i := range samples {
		labels[i] = samples[i].Label
		scores[i] = samples[i].Prob // only 25 distinct values: many ties
	}
	var num, den float64
	for i := range samples {
		for j := range samples {
			if labels[i] == 1 && labels[j] == 0 {
				den++
				switch {
				case scores[i] > scores[j]:
					num++
				case scores[i] == scores[j]:
					num += 0.5
				}
			}
		}
	}
	if got, want := AUC(labels, scores), num/den; den < 100 || !(math.Abs(got-want) <= 1e-12) {
		t.Fatalf("AUC = %v, pairwise = %v over %v pairs", got, want, den)
	}
}

func TestLogLoss(t *testing.T) {
	ln := math.Log
	for _, tc := range []struct {
		name   string
		labels []float32
		probs  []float64
		want   float64
	}{
		{"one positive", []float32{1}, []float64{0.8}, -ln(0.8)},
		{"one negative", []float32{0}, []float64{0.8}, -ln(0.2)},
		{"mean", []float32{1, 0}, []float64{0.5, 0.25}, (ln(2) - ln(0.75)) / 2},
		{"all one class", []float32{1, 1}, []float64{0.5, 0.5}, ln(2)},
		{"clamped 0", []float32{1}, []float64{0}, -ln(LogLossEps)},
		{"clamped 1", []float32{0}, []float64{1}, -math.Log1p(-(1 - LogLossEps))},
		{"clamped below 0", []float32{0}, []float64{-3}, -math.Log1p(-LogLossEps)},
	} {
		if got := LogLoss(tc.labels, tc.probs); !(math.Abs(got-tc.want) <= 1e-9) {
			t.Errorf("%s: LogLoss = %v, want %v", tc.name, got, tc.want)
		}
	}
	if got := LogLoss(nil, nil); !math.IsNaN(got) {
		t.Errorf("LogLoss of nothing = %v, want NaN", got)
	}
	if got := LogLoss([]float32{1}, []float64{math.NaN()}); !math.IsNaN(got) {
		t.Errorf("LogLoss of NaN = %v, want NaN", got)
	}
}

func TestMetricsLengthMismatchPanics(t *testing.T) {
	for name, f := range map[string]func(){
		"AUC":     func() { AUC([]float32{1}, nil) },
		"LogLoss": func() { LogLoss([]float32{1}, nil) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s with mismatched lengths did not panic", name)
				}
			}()
			f()
		}()
	}
}
