package collective

import (
	"context"
	"errors"
	"fmt"
	"math"
	"testing"
)

// value is rank r's input at index i: deterministic, with signs and
// magnitudes spread over several decades so that the order of additions
// changes the float32 result.
func value(r, i int) float32 {
	h := uint64(r)*0x9e3779b97f4a7c15 + uint64(i)*0xbf58476d1ce4e5b9 + 1
	h ^= h >> 31
	h *= 0x94d049bb133111eb
	h ^= h >> 29
	mant := float64(h&0xffffff)/float64(1<<24) - 0.5
	exp := int((h>>24)%7) - 3
	return float32(mant * math.Pow(10, float64(exp)))
}

func inputs(n, size int) [][]float32 {
	bufs := make([][]float32, n)
	for r := range bufs {
		bufs[r] = make([]float32, size)
		for i := range bufs[r] {
			bufs[r][i] = value(r, i)
		}
	}
	return bufs
}

// checkReduced compares every rank's result with a naive float64 sum of the
// inputs in rank order, within a tolerance relative to the sum of absolute
// values, and checks that all ranks hold bit-identical results.
func checkReduced(t *testing.T, n int, in, out [][]float32, op Op) {
	t.Helper()
	size := len(out[0])
	bad := 0
	for i := range size {
		var sum, abs float64
		for r := range n {
			sum += float64(in[r][i])
			abs += math.Abs(float64(in[r][i]))
		}
		tol := 4 * float64(n) * abs * (1.0 / (1 << 23))
		if op == Mean {
			sum /= float64(n)
			tol /= float64(n)
		}
		got := out[0][i]
		if d := math.Abs(float64(got) - sum); d > tol+1e-30 {
			if bad++; bad < 5 {
				t.Errorf("element %d: got %g, want %g (diff %g > tol %g)", i, got, sum, d, tol)
			}
		}
		for r := 1; r < n; r++ {
			if math.Float32bits(out[r][i]) != math.Float32bits(got) {
				if bad++; bad < 5 {
					t.Errorf("element %d: rank %d has %g (%#x), rank 0 has %g (%#x)", i, r, out[r][i], math.Float32bits(out[r][i]), got, math.Float32bits(got))
				}
			}
		}
	}
	if bad > 0 {
		t.Fatalf("%d bad elements of %d", bad, size)
	}
}

func runAllReduce(t *testing.T, gs []*Group, size int, op Op) {
	t.Helper()
	n := len(gs)
	in := inputs(n, size)
	out := make([][]float32, n)
	for r := range out {
		out[r] = append([]float32(nil), in[r]...)
	}
	noErrors(t, onAll(gs, func(r int, g *Group) error {
		return g.AllReduce(context.Background(), out[r], op)
	}))
	checkReduced(t, n, in, out, op)
}

func TestAllReduce(t *testing.T) {
	sizes := []int{1, 2, 7, 1000, 1<<16 + 3}
	configs := []struct {
		name string
		mod  func(*Config)
	}{
		{"auto", nil},
		// Small chunks so that segments span several frames.
		{"ring", func(c *Config) { c.Algorithm = Ring; c.ChunkBytes = 4 << 10 }},
		{"recursive", func(c *Config) { c.Algorithm = RecursiveDoubling }},
	}
	for n := 1; n <= 8; n++ {
		for _, cf := range configs {
			t.Run(fmt.Sprintf("N=%d/%s", n, cf.name), func(t *testing.T) {
				gs := makeGroup(t, n, cf.mod)
				for _, size := range sizes {
					for _, op := range []Op{Sum, Mean} {
						t.Run(fmt.Sprintf("%d/%s", size, op), func(t *testing.T) {
							runAllReduce(t, gs, size, op)
						})
					}
				}
			})
		}
	}
}

func TestAllReduceEmpty(t *testing.T) {
	for _, algo := range []Algorithm{Ring, RecursiveDoubling} {
		gs := makeGroup(t, 3, func(c *Config) { c.Algorithm = algo })
		noErrors(t, onAll(gs, func(r int, g *Group) error {
			return g.AllReduce(context.Background(), nil, Sum)
		}))
	}
}

// TestAllReduceLarge: 16 MiB per rank, N = 4, default chunk size, so the
// ring pipelines 8 chunks per segment.
func TestAllReduceLarge(t *testing.T) {
	if testing.Short() {
		t.Skip("large buffer")
	}
	gs := makeGroup(t, 4, nil)
	runAllReduce(t, gs, 4<<20, Mean)
}

// TestAllReduceAutoThreshold: the sizes on either side of SmallBytes pick
// the two algorithms, and both agree with the naive sum.
func TestAllReduceAutoThreshold(t *testing.T) {
	gs := makeGroup(t, 3, func(c *Config) { c.SmallBytes = 400 })
	if a := gs[0].algorithmFor(100); a != RecursiveDoubling {
		t.Fatalf("100 elements: %s", a)
	}
	if a := gs[0].algorithmFor(101); a != Ring {
		t.Fatalf("101 elements: %s", a)
	}
	runAllReduce(t, gs, 100, Sum)
	runAllReduce(t, gs, 101, Sum)
}

func TestAllReduceLengthMismatch(t *testing.T) {
	for _, algo := range []Algorithm{Ring, RecursiveDoubling} {
		t.Run(algo.String(), func(t *testing.T) {
			gs := makeGroup(t, 3, func(c *Config) { c.Algorithm = algo })
			errs := onAll(gs, func(r int, g *Group) error {
				return g.AllReduce(context.Background(), make([]float32, 100+r), Sum)
			})
			mismatch := 0
			for r, err := range errs {
				if err == nil {
					t.Errorf("rank %d: no error", r)
				} else if errors.Is(err, ErrMismatch) {
					mismatch++
				}
				t.Logf("rank %d: %v", r, err)
			}
			if mismatch == 0 {
				t.Error("no rank reported ErrMismatch")
			}
			if err := gs[0].Barrier(context.Background()); !errors.Is(err, ErrGroupBroken) {
				t.Errorf("after a failure: %v, want ErrGroupBroken", err)
			}
		})
	}
}

// TestAddInto: addInto (SSE on amd64) gives the same bits as the Go loop,
// NaN payloads included, for every length around the 16-float blocks.
func TestAddInto(t *testing.T) {
	nan1, nan2 := math.Float32frombits(0x7fc00001), math.Float32frombits(0xffc00002)
	for l := range 70 {
		dst, src := make([]float32, l), make([]float32, l+3)
		for i := range dst {
			dst[i] = value(0, i)
		}
		for i := range src {
			src[i] = value(1, i)
		}
		for i := 0; i < l; i += 5 {
			dst[i] = nan1
			if i%10 == 0 {
				src[i] = nan2
			}
		}
		want := append([]float32(nil), dst...)
		addIntoGo(want, src)
		addInto(dst, src)
		for i := range dst {
			if math.Float32bits(dst[i]) != math.Float32bits(want[i]) {
				t.Fatalf("len %d, element %d: %#x, want %#x", l, i, math.Float32bits(dst[i]), math.Float32bits(want[i]))
			}
		}
	}
}
