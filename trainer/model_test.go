package trainer

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"
)

// gradBatch is a small batch that exercises every path: keys repeated across
// samples and within a sample, values other than 1, a field with no key,
// dense features, both labels.
func gradBatch() *Batch {
	k := func(f int, id uint64) uint64 { return MakeKey(f, id) }
	return NewBatch([]Sample{
		{Label: 1, Keys: []uint64{k(0, 1), k(1, 7), k(2, 3)}, Vals: []float32{1, 0.5, -1.5}, Dense: []float32{0.3, -1}},
		{Label: 0, Keys: []uint64{k(0, 1), k(0, 2), k(2, 3), k(0, 1)}, Dense: []float32{1.2, 0}},
		{Label: 1, Keys: []uint64{k(1, 7)}, Dense: []float32{-0.4, 2}},
		{Label: 0, Keys: nil, Dense: []float32{0, 0.5}},
	})
}

func TestNewBatch(t *testing.T) {
	b := gradBatch()
	wantKeys := []uint64{MakeKey(0, 1), MakeKey(1, 7), MakeKey(2, 3), MakeKey(0, 2)}
	if !equalU64(b.Keys, wantKeys) {
		t.Fatalf("Keys = %x, want %x", b.Keys, wantKeys)
	}
	wantIndex := []int32{0, 1, 2, 0, 3, 2, 0, 1}
	wantOff := []int32{0, 3, 7, 8, 8}
	for i, v := range wantIndex {
		if b.Index[i] != v {
			t.Fatalf("Index = %v, want %v", b.Index, wantIndex)
		}
	}
	for i, v := range wantOff {
		if b.Offsets[i] != v {
			t.Fatalf("Offsets = %v, want %v", b.Offsets, wantOff)
		}
	}
	if got := NewBatch(nil); len(got.Keys) != 0 || len(got.Offsets) != 1 {
		t.Fatalf("empty batch: %+v", got)
	}
}

func randomF32(r *rand.Rand, n int, scale float64) []float32 {
	out := make([]float32, n)
	for i := range out {
		out[i] = float32(r.NormFloat64() * scale)
	}
	return out
}

// checkGradients compares the model's gradients with central differences of
// its loss, for every row value and every dense parameter.
func checkGradients(t *testing.T, m Model, b *Batch, rows, dense []float32) {
	t.Helper()
	loss, rowGrad, denseGrad, err := m.Gradients(b, rows, dense)
	if err != nil {
		t.Fatal(err)
	}
	if len(rowGrad) != len(rows) || len(denseGrad) != len(dense) {
		t.Fatalf("gradient lengths %d, %d; want %d, %d", len(rowGrad), len(denseGrad), len(rows), len(dense))
	}
	// The loss must agree with LogLoss of Predict.
	probs, err := m.Predict(b, rows, dense)
	if err != nil {
		t.Fatal(err)
	}
	if ll := LogLoss(b.Labels(), probs); math.Abs(ll-loss) > 1e-6 {
		t.Errorf("loss %v, LogLoss(Predict) %v", loss, ll)
	}
	const eps = 1e-3
	lossAt := func(p []float32, i int, v float32) float64 {
		old := p[i]
		p[i] = v
		l, _, _, err := m.Gradients(b, rows, dense)
		p[i] = old
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	check := func(what string, p, g []float32) {
		for i := range p {
			num := (lossAt(p, i, p[i]+eps) - lossAt(p, i, p[i]-eps)) / (2 * eps)
			if d := math.Abs(num - float64(g[i])); d > 1e-4+2e-3*math.Abs(num) {
				t.Errorf("%s[%d]: gradient %.6g, numeric %.6g", what, i, g[i], num)
			}
		}
	}
	check("row", rows, rowGrad)
	check("dense", dense, denseGrad)
}

func TestLRGradients(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	b := gradBatch()
	m := LR{DenseIn: 2}
	checkGradients(t, m, b, randomF32(r, len(b.Keys), 0.5), randomF32(r, m.DenseSize(), 0.5))
}

func TestDLRMGradients(t *testing.T) {
	for _, hidden := range [][]int{nil, {5}, {6, 4}} {
		m, err := NewDLRM(DLRMConfig{Fields: 3, Dim: 4, DenseIn: 2, Hidden: hidden})
		if err != nil {
			t.Fatal(err)
		}
		r := rand.New(rand.NewPCG(3, 4))
		b := gradBatch()
		dense := m.InitDense(7)
		for i := range dense { // non-zero biases too
			dense[i] += float32(r.NormFloat64() * 0.1)
		}
		checkGradients(t, m, b, randomF32(r, len(b.Keys)*m.Dim(), 0.5), dense)
	}
}

func TestDLRMLayout(t *testing.T) {
	m, err := NewDLRM(DLRMConfig{Fields: 3, Dim: 4, DenseIn: 2, Hidden: []int{6, 5}})
	if err != nil {
		t.Fatal(err)
	}
	// n = 14, 6, 5, 1: layers of 14*6+6, 6*5+5, 5*1+1 parameters.
	want := []int{0, 90, 125, 131}
	got := m.LayerOffsets()
	if len(got) != len(want) || m.DenseSize() != 131 {
		t.Fatalf("LayerOffsets %v, DenseSize %d; want %v", got, m.DenseSize(), want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("LayerOffsets %v, want %v", got, want)
		}
	}
	a, c := m.InitDense(1), m.InitDense(1)
	if !equalF32(a, c) || equalF32(a, m.InitDense(2)) {
		t.Fatal("InitDense is not a function of the seed")
	}
	for _, i := range []int{84, 89, 120, 124, 130} { // biases start at zero
		if a[i] != 0 {
			t.Errorf("dense[%d] = %v, want a zero bias", i, a[i])
		}
	}
	if limit := float32(math.Sqrt(6.0 / 20)); a[0] == 0 || a[0] > limit || a[0] < -limit {
		t.Errorf("dense[0] = %v, want a Glorot value within ±%v", a[0], limit)
	}
}

func TestModelShapeErrors(t *testing.T) {
	dlrm, err := NewDLRM(DLRMConfig{Fields: 2, Dim: 2, DenseIn: 2})
	if err != nil {
		t.Fatal(err)
	}
	b := gradBatch() // has a key of field 2
	for _, tc := range []struct {
		name        string
		m           Model
		b           *Batch
		rows, dense int
	}{
		{"LR rows", LR{DenseIn: 2}, b, len(b.Keys) + 1, 3},
		{"LR dense", LR{DenseIn: 2}, b, len(b.Keys), 2},
		{"LR sample dense", LR{DenseIn: 3}, b, len(b.Keys), 4},
		{"DLRM field", dlrm, b, len(b.Keys) * 2, dlrm.DenseSize()},
		{"DLRM rows", dlrm, b, len(b.Keys), dlrm.DenseSize()},
		{"vals", LR{}, NewBatch([]Sample{{Keys: []uint64{1, 2}, Vals: []float32{1}}}), 2, 1},
	} {
		rows, dense := make([]float32, tc.rows), make([]float32, tc.dense)
		if _, _, _, err := tc.m.Gradients(tc.b, rows, dense); !errors.Is(err, ErrShape) {
			t.Errorf("%s: Gradients err = %v, want ErrShape", tc.name, err)
		}
		if _, err := tc.m.Predict(tc.b, rows, dense); !errors.Is(err, ErrShape) {
			t.Errorf("%s: Predict err = %v, want ErrShape", tc.name, err)
		}
	}
	for _, cfg := range []DLRMConfig{
		{Fields: 0, Dim: 1}, {Fields: 1, Dim: 0}, {Fields: 1, Dim: 1, DenseIn: -1}, {Fields: 1, Dim: 1, Hidden: []int{3, 0}},
	} {
		if _, err := NewDLRM(cfg); err == nil {
			t.Errorf("NewDLRM(%+v) succeeded", cfg)
		}
	}
}

func TestBCEWithLogitExtremes(t *testing.T) {
	for _, tc := range []struct {
		z    float64
		y    float32
		want float64
	}{
		{0, 1, math.Ln2}, {0, 0, math.Ln2}, {800, 1, 0}, {800, 0, 800}, {-800, 0, 0}, {-800, 1, 800},
	} {
		if got := bceWithLogit(tc.z, tc.y); math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("bce(%v, %v) = %v, want %v", tc.z, tc.y, got, tc.want)
		}
	}
	if sigmoid(-800) != 0 || sigmoid(800) != 1 || sigmoid(0) != 0.5 {
		t.Error("sigmoid extremes")
	}
}
