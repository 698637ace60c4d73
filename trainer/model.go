package trainer

import (
	"errors"
	"fmt"
	"math"
)

// Model is a CTR model whose embedding rows live in the parameter server and
// whose dense parameters are one flat []float32 replicated on every trainer.
// The model owns neither: a training step is
//
//  1. b := NewBatch(samples)
//  2. rows := pull(b.Keys)                 // len(b.Keys)*Dim(), in b.Keys order
//  3. loss, rowGrad, denseGrad, err := m.Gradients(b, rows, dense)
//  4. push(b.Keys, rowGrad)                // same layout as rows
//  5. dense -= lr * allreduce(denseGrad)   // or any dense optimizer
//
// Gradients are those of the batch's mean loss, so a row's gradient is summed
// over every occurrence of its key in the batch. Implementations only read
// rows and dense and keep no state between calls, so one Model may be used by
// many goroutines at once.
type Model interface {
	// Dim is the length of one embedding row.
	Dim() int
	// DenseSize is the length of the flat dense parameter vector.
	DenseSize() int
	// InitDense returns freshly initialised dense parameters; the same seed
	// gives the same values on every machine.
	InitDense(seed uint64) []float32
	// Gradients runs forward and backward on b and returns the mean binary
	// cross-entropy loss, the gradient of every row of b.Keys (laid out like
	// rows) and the gradient of the dense parameters.
	Gradients(b *Batch, rows, dense []float32) (loss float64, rowGrad, denseGrad []float32, err error)
	// Predict returns the predicted probability of every sample of b.
	Predict(b *Batch, rows, dense []float32) ([]float64, error)
}

// ErrShape is returned when rows, dense parameters or a sample do not have
// the length the model expects.
var ErrShape = errors.New("trainer: shape mismatch")

// checkShapes checks rows and dense against b and m.
func checkShapes(m Model, b *Batch, rows, dense []float32) error {
	if want := len(b.Keys) * m.Dim(); len(rows) != want {
		return fmt.Errorf("%w: %d row values for %d keys of dim %d (want %d)", ErrShape, len(rows), len(b.Keys), m.Dim(), want)
	}
	if len(dense) != m.DenseSize() {
		return fmt.Errorf("%w: %d dense parameters, model has %d", ErrShape, len(dense), m.DenseSize())
	}
	return nil
}

// checkSample checks that sample i of b has n dense features and consistent
// values.
func checkSample(b *Batch, i, n int) error {
	s := &b.Samples[i]
	if len(s.Dense) != n {
		return fmt.Errorf("%w: sample %d has %d dense features, model takes %d", ErrShape, i, len(s.Dense), n)
	}
	if s.Vals != nil && len(s.Vals) != len(s.Keys) {
		return fmt.Errorf("%w: sample %d has %d keys and %d values", ErrShape, i, len(s.Keys), len(s.Vals))
	}
	return nil
}

// sigmoid returns 1/(1+e^-z) without overflow.
func sigmoid(z float64) float64 {
	if z >= 0 {
		return 1 / (1 + math.Exp(-z))
	}
	e := math.Exp(z)
	return e / (1 + e)
}

// bceWithLogit returns the binary cross-entropy of label y for logit z,
// log(1+e^z) - y*z, computed without overflow.
func bceWithLogit(z float64, y float32) float64 {
	var sp float64 // softplus(z)
	if z > 0 {
		sp = z + math.Log1p(math.Exp(-z))
	} else {
		sp = math.Log1p(math.Exp(z))
	}
	if y != 0 {
		return sp - z
	}
	return sp
}

// label01 returns 1 for a positive label and 0 otherwise.
func label01(y float32) float64 {
	if y != 0 {
		return 1
	}
	return 0
}
