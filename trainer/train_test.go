package trainer

import (
	"testing"
)

// sgdTrain trains m with plain SGD on samples [0, steps*batch) of s, keeping
// the rows in a map that stands in for the parameter server (rows it has not
// seen start at init(key)). It returns the rows and dense parameters.
func sgdTrain(t *testing.T, m Model, s *Synthetic, steps, batch int, lr float32, init func(key uint64, row []float32)) (map[uint64][]float32, []float32) {
	t.Helper()
	table := make(map[uint64][]float32)
	dense := m.InitDense(1)
	for step := range steps {
		b := NewBatch(s.Samples(uint64(step*batch), batch))
		rows := pull(m, table, b.Keys, init)
		_, rowGrad, denseGrad, err := m.Gradients(b, rows, dense)
		if err != nil {
			t.Fatal(err)
		}
		d := m.Dim()
		for u, k := range b.Keys { // push: the server applies SGD
			row := table[k]
			for c := range row {
				row[c] -= lr * rowGrad[u*d+c]
			}
		}
		for i := range dense {
			dense[i] -= lr * denseGrad[i]
		}
	}
	return table, dense
}

// pull returns the rows of keys from table, creating missing ones with init.
func pull(m Model, table map[uint64][]float32, keys []uint64, init func(uint64, []float32)) []float32 {
	d := m.Dim()
	rows := make([]float32, len(keys)*d)
	for u, k := range keys {
		row, ok := table[k]
		if !ok {
			row = make([]float32, d)
			if init != nil {
				init(k, row)
			}
			table[k] = row
		}
		copy(rows[u*d:], row)
	}
	return rows
}

// evaluate returns the model's AUC and logloss on samples of s from start,
// and the Bayes-optimal ones.
func evaluate(t *testing.T, m Model, s *Synthetic, table map[uint64][]float32, dense []float32, start uint64, n int) (auc, ll, bayesAUC, bayesLL float64) {
	t.Helper()
	samples := s.Samples(start, n)
	b := NewBatch(samples)
	rows := pull(m, table, b.Keys, nil)
	probs, err := m.Predict(b, rows, dense)
	if err != nil {
		t.Fatal(err)
	}
	labels := b.Labels()
	bayesAUC, bayesLL = BayesMetrics(samples)
	return AUC(labels, probs), LogLoss(labels, probs), bayesAUC, bayesLL
}

// TestTrainLRSmoke trains logistic regression with SGD against a map and
// checks that it approaches the Bayes-optimal AUC: the pieces fit.
func TestTrainLRSmoke(t *testing.T) {
	cfg := DefaultSyntheticConfig()
	s, err := NewSynthetic(cfg)
	if err != nil {
		t.Fatal(err)
	}
	m := LR{}
	table, dense := sgdTrain(t, m, s, 2000, 64, 2, nil)
	auc, ll, bayesAUC, bayesLL := evaluate(t, m, s, table, dense, 1<<40, 20_000)
	t.Logf("LR: AUC %.4f logloss %.4f; Bayes AUC %.4f logloss %.4f", auc, ll, bayesAUC, bayesLL)
	if auc < bayesAUC-0.05 || auc < 0.6 {
		t.Errorf("AUC %.4f, want within 0.05 of Bayes %.4f", auc, bayesAUC)
	}
	if ll > bayesLL+0.05 {
		t.Errorf("logloss %.4f, want within 0.05 of Bayes %.4f", ll, bayesLL)
	}
}

// TestTrainDLRMSmoke does the same for the embedding-bag + MLP model, with
// rows initialised like a table's normal(0.1) initializer.
func TestTrainDLRMSmoke(t *testing.T) {
	cfg := DefaultSyntheticConfig()
	s, err := NewSynthetic(cfg)
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewDLRM(DLRMConfig{Fields: cfg.Fields, Dim: 4, Hidden: []int{16}})
	if err != nil {
		t.Fatal(err)
	}
	init := func(key uint64, row []float32) {
		for c := range row {
			row[c] = float32(0.1 * gaussianish(mix64(7, key, uint64(c))))
		}
	}
	table, dense := sgdTrain(t, m, s, 2000, 64, 0.5, init)
	auc, ll, bayesAUC, bayesLL := evaluate(t, m, s, table, dense, 1<<40, 20_000)
	t.Logf("DLRM: AUC %.4f logloss %.4f; Bayes AUC %.4f logloss %.4f", auc, ll, bayesAUC, bayesLL)
	if auc < bayesAUC-0.05 || auc < 0.6 {
		t.Errorf("AUC %.4f, want within 0.05 of Bayes %.4f", auc, bayesAUC)
	}
}
