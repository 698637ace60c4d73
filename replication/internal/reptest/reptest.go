package reptest

import (
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/raftps/raftps/store"
)

// SGDTable is a table of dim whose optimizer is SGD with learning rate 1:
// a row is minus the sum of the gradients pushed to it.
func SGDTable(name string, dim int) store.TableConfig {
	return store.TableConfig{Name: name, Dim: dim, Optimizer: store.Optimizer{Kind: store.SGD, LR: 1}}
}

// Workload: clients push small integer gradients (SGD, lr 1) to keys of a
// small space, so every row is an exact sum and any lost or doubled push
// shows. Its methods are safe for concurrent use.
type Workload struct {
	dim      int
	mu       sync.Mutex
	expected map[uint64][]float32 // key -> -(sum of acknowledged gradients)
	acked    int
}

// NewWorkload returns a workload on a table of dim (SGDTable).
func NewWorkload(dim int) *Workload {
	return &Workload{dim: dim, expected: map[uint64][]float32{}}
}

// Rows returns the keys and gradients of a new push, drawn from rng.
func (w *Workload) Rows(rng *rand.Rand) (keys []uint64, grads []float32) {
	n := 1 + rng.IntN(8)
	keys, grads = make([]uint64, n), make([]float32, n*w.dim)
	for i := range keys {
		keys[i] = uint64(rng.IntN(40))
	}
	for i := range grads {
		grads[i] = float32(rng.IntN(7) - 3)
	}
	return keys, grads
}

// Acknowledge records a push the cluster acknowledged: Check expects it in
// every row, once.
func (w *Workload) Acknowledge(keys []uint64, grads []float32) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.acked++
	for i, k := range keys {
		row := w.expected[k]
		if row == nil {
			row = make([]float32, w.dim)
			w.expected[k] = row
		}
		for c := range row {
			row[c] -= grads[i*w.dim+c]
		}
	}
}

// Acked returns how many pushes were acknowledged.
func (w *Workload) Acked() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.acked
}

// Expected returns the keys acknowledged pushes touched, and their rows
// (len(keys) × dim values) as those pushes make them.
func (w *Workload) Expected() (keys []uint64, rows []float32) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for k, row := range w.expected {
		keys = append(keys, k)
		rows = append(rows, row...)
	}
	return keys, rows
}

// Check fails t unless every row of tab that an acknowledged push touched
// is the sum of those pushes.
func (w *Workload) Check(t testing.TB, tab *store.Table) {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]float32, w.dim)
	for k, want := range w.expected {
		if err := tab.Lookup([]uint64{k}, out); err != nil {
			t.Fatal(err)
		}
		for c := range want {
			if out[c] != want[c] {
				t.Fatalf("key %d column %d = %v, acknowledged pushes sum to %v (lost or doubled push)", k, c, out[c], want[c])
			}
		}
	}
}
