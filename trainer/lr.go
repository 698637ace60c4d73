package trainer

import "fmt"

// LR is logistic regression over sparse and dense features:
//
//	logit = dense[0] + sum_j rows[key_j] * val_j + sum_i dense[1+i] * x_i
//
// Embedding rows have dimension 1 (one weight per key). The dense parameters
// are [bias, weight of dense feature 0, ..., weight of dense feature
// DenseIn-1].
type LR struct {
	// DenseIn is the number of dense features every sample must have.
	DenseIn int
}

var _ Model = LR{}

// Dim is 1.
func (LR) Dim() int { return 1 }

// DenseSize is 1 + DenseIn.
func (m LR) DenseSize() int { return 1 + m.DenseIn }

// InitDense returns zeros (logistic regression needs no symmetry breaking).
func (m LR) InitDense(uint64) []float32 { return make([]float32, m.DenseSize()) }

func (m LR) logits(b *Batch, rows, dense []float32) ([]float64, error) {
	if m.DenseIn < 0 {
		return nil, fmt.Errorf("trainer: LR DenseIn (%d) must be >= 0", m.DenseIn)
	}
	if err := checkShapes(m, b, rows, dense); err != nil {
		return nil, err
	}
	z := make([]float64, len(b.Samples))
	for i := range b.Samples {
		if err := checkSample(b, i, m.DenseIn); err != nil {
			return nil, err
		}
		s := &b.Samples[i]
		acc := dense[0]
		for j, u := range b.Index[b.Offsets[i]:b.Offsets[i+1]] {
			acc += rows[u] * s.Val(j)
		}
		for d, x := range s.Dense {
			acc += dense[1+d] * x
		}
		z[i] = float64(acc)
	}
	return z, nil
}

// Gradients implements Model.
func (m LR) Gradients(b *Batch, rows, dense []float32) (float64, []float32, []float32, error) {
	z, err := m.logits(b, rows, dense)
	if err != nil {
		return 0, nil, nil, err
	}
	rowGrad := make([]float32, len(rows))
	denseGrad := make([]float32, len(dense))
	if len(b.Samples) == 0 {
		return 0, rowGrad, denseGrad, nil
	}
	inv := 1 / float64(len(b.Samples))
	var loss float64
	for i := range b.Samples {
		s := &b.Samples[i]
		loss += bceWithLogit(z[i], s.Label)
		g := float32((sigmoid(z[i]) - label01(s.Label)) * inv) // dLoss/dz
		denseGrad[0] += g
		for j, u := range b.Index[b.Offsets[i]:b.Offsets[i+1]] {
			rowGrad[u] += g * s.Val(j)
		}
		for d, x := range s.Dense {
			denseGrad[1+d] += g * x
		}
	}
	return loss * inv, rowGrad, denseGrad, nil
}

// Predict implements Model.
func (m LR) Predict(b *Batch, rows, dense []float32) ([]float64, error) {
	z, err := m.logits(b, rows, dense)
	if err != nil {
		return nil, err
	}
	for i := range z {
		z[i] = sigmoid(z[i])
	}
	return z, nil
}
