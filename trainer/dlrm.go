package trainer

import (
	"fmt"
	"math"
	"math/rand/v2"
)

// DLRMConfig shapes a DLRM.
type DLRMConfig struct {
	// Fields is the number of sparse fields; every key's field (KeyField)
	// must be below it.
	Fields int
	// Dim is the embedding dimension.
	Dim int
	// DenseIn is the number of dense features every sample must have.
	DenseIn int
	// Hidden are the sizes of the hidden layers (ReLU), input side first;
	// empty makes the model linear in the bags and dense features.
	Hidden []int
}

// DLRM is an embedding-bag + MLP model in the manner of DLRM: for each field,
// the bag is the sum of val * row over that field's keys in the sample (zeros
// when the field has none); the bags of fields 0..Fields-1 and the dense
// features, concatenated, go through the MLP (ReLU after every hidden layer,
// none after the last) to one logit; the loss is binary cross-entropy.
//
// Dense parameter layout: with sizes n_0 = Fields*Dim + DenseIn, n_1..n_k =
// Hidden, n_{k+1} = 1, layer l (0..k) takes n_l inputs to n_{l+1} outputs and
// stores its weights W_l, row-major (W_l[o*n_l + i] multiplies input i of
// output o), followed by its biases b_l (n_{l+1} values); the layers follow
// one another from the input side. LayerOffsets gives where each layer begins.
type DLRM struct {
	cfg   DLRMConfig
	sizes []int // n_0 .. n_{k+1}
	off   []int // off[l] = start of W_l in the dense vector; off[k+1] = DenseSize
}

var _ Model = (*DLRM)(nil)

// NewDLRM checks cfg and returns the model.
func NewDLRM(cfg DLRMConfig) (*DLRM, error) {
	switch {
	case cfg.Fields < 1 || cfg.Fields > MaxFields:
		return nil, fmt.Errorf("trainer: DLRM Fields (%d) must be in [1, %d]", cfg.Fields, MaxFields)
	case cfg.Dim < 1:
		return nil, fmt.Errorf("trainer: DLRM Dim (%d) must be >= 1", cfg.Dim)
	case cfg.DenseIn < 0:
		return nil, fmt.Errorf("trainer: DLRM DenseIn (%d) must be >= 0", cfg.DenseIn)
	}
	sizes := []int{cfg.Fields*cfg.Dim + cfg.DenseIn}
	for i, h := range cfg.Hidden {
		if h < 1 {
			return nil, fmt.Errorf("trainer: DLRM Hidden[%d] (%d) must be >= 1", i, h)
		}
		sizes = append(sizes, h)
	}
	sizes = append(sizes, 1)
	off := []int{0}
	for l := 0; l+1 < len(sizes); l++ {
		off = append(off, off[l]+sizes[l]*sizes[l+1]+sizes[l+1])
	}
	cfg.Hidden = append([]int(nil), cfg.Hidden...)
	return &DLRM{cfg: cfg, sizes: sizes, off: off}, nil
}

// Config returns the model's config.
func (m *DLRM) Config() DLRMConfig {
	c := m.cfg
	c.Hidden = append([]int(nil), c.Hidden...)
	return c
}

// Dim implements Model.
func (m *DLRM) Dim() int { return m.cfg.Dim }

// DenseSize implements Model.
func (m *DLRM) DenseSize() int { return m.off[len(m.off)-1] }

// LayerOffsets returns, for each layer l, the offset of W_l in the dense
// vector (b_l follows W_l), and last the total size.
func (m *DLRM) LayerOffsets() []int { return append([]int(nil), m.off...) }

// InitDense returns Glorot-uniform weights (uniform in ±sqrt(6/(n_in+n_out)))
// drawn from a PCG stream seeded by seed, and zero biases.
func (m *DLRM) InitDense(seed uint64) []float32 {
	r := rand.New(rand.NewPCG(seed, 0xd15e0f1a7))
	dense := make([]float32, m.DenseSize())
	for l := 0; l+1 < len(m.sizes); l++ {
		in, out := m.sizes[l], m.sizes[l+1]
		limit := math.Sqrt(6 / float64(in+out))
		w := dense[m.off[l] : m.off[l]+in*out]
		for i := range w {
			w[i] = float32((2*r.Float64() - 1) * limit)
		}
	}
	return dense
}

// scratch holds one sample's activations: acts[l] is the input of layer l
// (acts[0] the concatenated bags and dense features, acts[l>0] post-ReLU).
type scratch struct {
	acts [][]float32
}

func (m *DLRM) newScratch() *scratch {
	s := &scratch{acts: make([][]float32, len(m.sizes))}
	for l, n := range m.sizes {
		s.acts[l] = make([]float32, n)
	}
	return s
}

// forward computes sample i's logit, leaving the activations in sc.
func (m *DLRM) forward(b *Batch, i int, rows, dense []float32, sc *scratch) (float64, error) {
	if err := checkSample(b, i, m.cfg.DenseIn); err != nil {
		return 0, err
	}
	s := &b.Samples[i]
	d := m.cfg.Dim
	x := sc.acts[0]
	clear(x)
	for j, u := range b.Index[b.Offsets[i]:b.Offsets[i+1]] {
		f := KeyField(s.Keys[j])
		if f >= m.cfg.Fields {
			return 0, fmt.Errorf("%w: sample %d key %#x has field %d, model has %d fields", ErrShape, i, s.Keys[j], f, m.cfg.Fields)
		}
		v := s.Val(j)
		bag := x[f*d : (f+1)*d]
		for c, r := range rows[int(u)*d : (int(u)+1)*d] {
			bag[c] += v * r
		}
	}
	copy(x[m.cfg.Fields*d:], s.Dense)
	last := len(m.sizes) - 2
	for l := 0; l <= last; l++ {
		in, out := sc.acts[l], m.sizes[l+1]
		w := dense[m.off[l] : m.off[l]+len(in)*out]
		bias := dense[m.off[l]+len(in)*out : m.off[l+1]]
		if l == last {
			acc := bias[0]
			for k, a := range in {
				acc += w[k] * a
			}
			return float64(acc), nil
		}
		next := sc.acts[l+1]
		for o := range out {
			acc := bias[o]
			for k, a := range in {
				acc += w[o*len(in)+k] * a
			}
			next[o] = max(acc, 0)
		}
	}
	panic("unreachable")
}

// Gradients implements Model.
func (m *DLRM) Gradients(b *Batch, rows, dense []float32) (float64, []float32, []float32, error) {
	if err := checkShapes(m, b, rows, dense); err != nil {
		return 0, nil, nil, err
	}
	rowGrad := make([]float32, len(rows))
	denseGrad := make([]float32, len(dense))
	if len(b.Samples) == 0 {
		return 0, rowGrad, denseGrad, nil
	}
	sc := m.newScratch()
	// delta[l] is dLoss/d(output of layer l before its activation), and
	// delta[0] ends as dLoss/d(input of layer 0).
	deltas := make([][]float32, len(m.sizes))
	for l, n := range m.sizes {
		deltas[l] = make([]float32, n)
	}
	inv := 1 / float64(len(b.Samples))
	d := m.cfg.Dim
	var loss float64
	for i := range b.Samples {
		z, err := m.forward(b, i, rows, dense, sc)
		if err != nil {
			return 0, nil, nil, err
		}
		s := &b.Samples[i]
		loss += bceWithLogit(z, s.Label)
		deltas[len(m.sizes)-1][0] = float32((sigmoid(z) - label01(s.Label)) * inv)
		for l := len(m.sizes) - 2; l >= 0; l-- {
			in, out := sc.acts[l], deltas[l+1]
			w := dense[m.off[l] : m.off[l]+len(in)*len(out)]
			gw := denseGrad[m.off[l] : m.off[l]+len(in)*len(out)]
			gb := denseGrad[m.off[l]+len(in)*len(out) : m.off[l+1]]
			din := deltas[l]
			clear(din)
			for o, g := range out {
				if g == 0 {
					continue
				}
				gb[o] += g
				row := w[o*len(in) : (o+1)*len(in)]
				grow := gw[o*len(in) : (o+1)*len(in)]
				for k, a := range in {
					grow[k] += g * a
					din[k] += g * row[k]
				}
			}
			if l > 0 { // through the ReLU that produced in
				for k, a := range in {
					if a <= 0 {
						din[k] = 0
					}
				}
			}
		}
		dx := deltas[0]
		for j, u := range b.Index[b.Offsets[i]:b.Offsets[i+1]] {
			f := KeyField(s.Keys[j])
			v := s.Val(j)
			g := rowGrad[int(u)*d : (int(u)+1)*d]
			for c, dc := range dx[f*d : (f+1)*d] {
				g[c] += v * dc
			}
		}
	}
	return loss * inv, rowGrad, denseGrad, nil
}

// Predict implements Model.
func (m *DLRM) Predict(b *Batch, rows, dense []float32) ([]float64, error) {
	if err := checkShapes(m, b, rows, dense); err != nil {
		return nil, err
	}
	sc := m.newScratch()
	out := make([]float64, len(b.Samples))
	for i := range b.Samples {
		z, err := m.forward(b, i, rows, dense, sc)
		if err != nil {
			return nil, err
		}
		out[i] = sigmoid(z)
	}
	return out, nil
}
