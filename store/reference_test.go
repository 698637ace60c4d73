package store

import (
	"math"
	"math/rand/v2"
	"testing"
)

// refTable is the oracle: the optimizers written out per coordinate from their
// textbook definitions over a plain map, with none of Table's machinery
// (slabs, index, staging, dedup hash). Table must match it bit for bit.
type refTable struct {
	cfg  TableConfig
	rows map[uint64]*refRow
}

type refRow struct {
	w, a, b  []float32 // values; Adagrad acc / Adam m / FTRL z; Adam v / FTRL n
	t        uint32
	b1t, b2t float32
}

func newRef(cfg TableConfig) *refTable { return &refTable{cfg: cfg, rows: map[uint64]*refRow{}} }

func (r *refTable) apply(keys []uint64, grads []float32) {
	dim := r.cfg.Dim
	var order []uint64
	sums := map[uint64][]float32{}
	for i, k := range keys {
		g := grads[i*dim : (i+1)*dim]
		s, seen := sums[k]
		if !seen {
			sums[k] = append([]float32(nil), g...)
			order = append(order, k)
			continue
		}
		for c := 0; c < dim; c++ {
			s[c] = s[c] + g[c]
		}
	}
	for _, k := range order {
		r.update(k, sums[k])
	}
}

func (r *refTable) row(k uint64) *refRow {
	if row, ok := r.rows[k]; ok {
		return row
	}
	dim := r.cfg.Dim
	row := &refRow{w: make([]float32, dim), a: make([]float32, dim), b: make([]float32, dim), b1t: 1, b2t: 1}
	initRow(r.cfg.Init, r.cfg.Seed, k, row.w)
	if r.cfg.Optimizer.Kind == Adagrad {
		for c := range row.a {
			row.a[c] = r.cfg.Optimizer.InitAcc
		}
	}
	r.rows[k] = row
	return row
}

func (r *refTable) update(k uint64, g []float32) {
	o := r.cfg.Optimizer
	row := r.row(k)
	if o.Kind == Adam {
		row.t++
		row.b1t = float32(row.b1t * o.Beta1)
		row.b2t = float32(row.b2t * o.Beta2)
	}
	for c := range g {
		switch o.Kind {
		case SGD:
			row.w[c] = row.w[c] - float32(o.LR*g[c])
		case Assign:
			row.w[c] = g[c]
		case Adagrad:
			row.a[c] = row.a[c] + float32(g[c]*g[c])
			row.w[c] = row.w[c] - float32(o.LR*g[c])/(sqrt32(row.a[c])+o.Eps)
		case Adam:
			row.a[c] = float32(o.Beta1*row.a[c]) + float32((1-o.Beta1)*g[c])
			row.b[c] = float32(o.Beta2*row.b[c]) + float32(float32((1-o.Beta2)*g[c])*g[c])
			mhat := row.a[c] / (1 - row.b1t)
			vhat := row.b[c] / (1 - row.b2t)
			row.w[c] = row.w[c] - float32(o.LR*mhat)/(sqrt32(vhat)+o.Eps)
		case FTRL:
			nOld := row.b[c]
			nNew := nOld + float32(g[c]*g[c])
			sigma := (sqrt32(nNew) - sqrt32(nOld)) / o.LR
			row.a[c] = (row.a[c] + g[c]) - float32(sigma*row.w[c])
			row.b[c] = nNew
			z := row.a[c]
			if z >= -o.L1 && z <= o.L1 {
				row.w[c] = 0
			} else {
				sign := float32(1)
				if z < 0 {
					sign = -1
				}
				row.w[c] = -(z - sign*o.L1) / ((o.Beta+sqrt32(nNew))/o.LR + o.L2)
			}
		}
	}
}

// randomBatch draws n keys from [0, space) (so duplicates are common) with
// gradients in (-scale, scale).
func randomBatch(rng *rand.Rand, n, space, dim int, scale float32) ([]uint64, []float32) {
	keys := make([]uint64, n)
	grads := make([]float32, n*dim)
	for i := range keys {
		keys[i] = uint64(rng.IntN(space)) * 0x9e3779b97f4a7c15 // spread, not sequential
	}
	for i := range grads {
		grads[i] = (rng.Float32()*2 - 1) * scale
	}
	return keys, grads
}

func optimizerCases() []Optimizer {
	ftrlL1 := DefaultOptimizer(FTRL)
	ftrlL1.L1, ftrlL1.L2, ftrlL1.Beta = 0.05, 0.01, 0.5
	adam := DefaultOptimizer(Adam)
	adam.LR = 0.05
	return []Optimizer{DefaultOptimizer(SGD), DefaultOptimizer(Adagrad), DefaultOptimizer(Adam), adam, DefaultOptimizer(FTRL), ftrlL1, DefaultOptimizer(Assign)}
}

func TestOptimizersMatchReference(t *testing.T) {
	inits := []Initializer{{Kind: InitZeros}, {Kind: InitUniform, Scale: 0.05}, {Kind: InitNormal, Scale: 0.1}}
	for _, opt := range optimizerCases() {
		for _, in := range inits {
			for _, dim := range []int{1, 7, 16} {
				cfg := TableConfig{Name: "t", Dim: dim, Init: in, Optimizer: opt, Seed: 42}
				t.Run(cfg.String(), func(t *testing.T) {
					tab, err := NewTable(cfg)
					if err != nil {
						t.Fatal(err)
					}
					ref := newRef(cfg)
					rng := rand.New(rand.NewPCG(uint64(dim), uint64(opt.Kind)))
					for range 150 {
						keys, grads := randomBatch(rng, 1+rng.IntN(40), 30, dim, 2)
						if err := tab.Apply(keys, grads); err != nil {
							t.Fatal(err)
						}
						ref.apply(keys, grads)
					}
					compareWithRef(t, tab, ref)
				})
			}
		}
	}
}

// compareWithRef checks that tab and ref hold the same keys with bit-identical
// values, optimizer state and Adam header.
func compareWithRef(t *testing.T, tab *Table, ref *refTable) {
	t.Helper()
	if tab.Len() != len(ref.rows) {
		t.Fatalf("table has %d rows, reference %d", tab.Len(), len(ref.rows))
	}
	l := tab.l
	same := func(what string, k uint64, got, want []float32) {
		t.Helper()
		for c := range want {
			if math.Float32bits(got[c]) != math.Float32bits(want[c]) {
				t.Fatalf("key %d %s[%d] = %v (%08x), reference %v (%08x)", k, what, c, got[c], math.Float32bits(got[c]), want[c], math.Float32bits(want[c]))
			}
		}
	}
	out := make([]float32, l.dim)
	for k, rr := range ref.rows {
		if err := tab.Lookup([]uint64{k}, out); err != nil {
			t.Fatal(err)
		}
		same("value", k, out, rr.w)
		slot, ok := tab.ix.find(tab.rows, k, hashKey(k))
		if !ok {
			t.Fatalf("key %d missing from index", k)
		}
		row := tab.rows.row(slot)
		st := l.state(row)
		switch tab.cfg.Optimizer.Kind {
		case Adagrad:
			same("accumulator", k, st, rr.a)
		case Adam, FTRL:
			same("state0", k, st[:l.dim], rr.a)
			same("state1", k, st[l.dim:], rr.b)
		}
		if tab.cfg.Optimizer.Kind == Adam {
			h := adamHeader(row)
			if h.step != rr.t || h.b1t != rr.b1t || h.b2t != rr.b2t {
				t.Fatalf("key %d Adam header (%d, %v, %v), reference (%d, %v, %v)", k, h.step, h.b1t, h.b2t, rr.t, rr.b1t, rr.b2t)
			}
		}
	}
}
