package store

import "math"

// This file holds the only arithmetic that changes rows. Replicas must agree to
// the bit, so it follows three rules:
//
//  1. float32 throughout, and every product that feeds an addition is wrapped
//     in an explicit float32(...) conversion. The Go spec lets a compiler fuse
//     x*y+z into one FMA (arm64 does, amd64 with GOAMD64=v3 may); an explicit
//     conversion forces the rounding and forbids the fusion.
//  2. No transcendental functions (math.Pow, Exp, Log): their results may
//     differ across architectures. Square root is exact (IEEE-754 requires it
//     correctly rounded), and sqrt of a float32 via float64 then rounded back
//     gives the correctly rounded float32 result.
//  3. A fixed order: coordinates left to right, keys in order of first
//     occurrence in the batch.

func sqrt32(x float32) float32 { return float32(math.Sqrt(float64(x))) }

// kernel applies one optimizer step with the summed gradient g to row in
// (layout l), writing the result to out. in and out are the same slice or do
// not overlap; either way each word of in is read before out's is written.
// Reading the live row and writing the staged one saves a copy pass.
//
// It returns the OR of finiteBits over every value and state word it wrote:
// bit 31 is set if any of them is NaN or ±Inf. Checking here, while the words
// are in registers, saves a pass over the staged rows.
type kernel func(o *Optimizer, l layout, in, out, g []float32) uint32

// finiteBits is 0x80000000 or more for NaN and ±Inf, less for every finite
// value: an all-ones exponent plus one carries into bit 31.
func finiteBits(x float32) uint32 { return math.Float32bits(x)&0x7f800000 + 0x00800000 }

const nonFiniteBit = 0x80000000

func kernelFor(k OptKind) kernel {
	switch k {
	case Adagrad:
		return adagradStep
	case Adam:
		return adamStep
	case FTRL:
		return ftrlStep
	case Assign:
		return assignStep
	}
	return sgdStep
}

// assignStep: w = g.
func assignStep(_ *Optimizer, l layout, in, out, g []float32) uint32 {
	copy(out[:l.hdr], in[:l.hdr])
	wo := l.values(out)
	g = g[:len(wo)]
	var bad uint32
	for i, x := range g {
		wo[i] = x
		bad |= finiteBits(x)
	}
	return bad
}

// sgdStep: w -= lr*g.
func sgdStep(o *Optimizer, l layout, in, out, g []float32) uint32 {
	copy(out[:l.hdr], in[:l.hdr])
	w, wo := l.values(in), l.values(out)
	lr := o.LR
	g, wo = g[:len(w)], wo[:len(w)]
	var bad uint32
	for i := range w {
		x := w[i] - float32(lr*g[i])
		wo[i] = x
		bad |= finiteBits(x)
	}
	return bad
}

// adagradStep: acc += g²; w -= lr*g / (sqrt(acc) + eps).
func adagradStep(o *Optimizer, l layout, in, out, g []float32) uint32 {
	copy(out[:l.hdr], in[:l.hdr])
	w, wo := l.values(in), l.values(out)
	n := len(w)
	lr, eps := o.LR, o.Eps
	acc, acco := l.state(in)[:n], l.state(out)[:n]
	g, wo = g[:n], wo[:n]
	var bad uint32
	for i := range w {
		gi := g[i]
		a := acc[i] + float32(gi*gi)
		x := w[i] - float32(lr*gi)/(sqrt32(a)+eps)
		acco[i], wo[i] = a, x
		bad |= finiteBits(a) | finiteBits(x)
	}
	return bad
}

// adamStep, with t the row's own step count (rows are updated sparsely, so a
// global step would over-correct rarely seen rows):
//
//	m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g²
//	w -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)
//
// b1^t and b2^t are carried in the row header and multiplied by b1 and b2 once
// a step, as TensorFlow does, rather than recomputed by a pow that could round
// differently on another CPU.
func adamStep(o *Optimizer, l layout, in, out, g []float32) uint32 {
	copy(out[:l.hdr], in[:l.hdr])
	h := adamHeader(out)
	if h.step < math.MaxUint32 {
		h.step++
	}
	b1, b2, lr, eps := o.Beta1, o.Beta2, o.LR, o.Eps
	h.b1t = float32(h.b1t * b1)
	h.b2t = float32(h.b2t * b2)
	c1, c2 := 1-h.b1t, 1-h.b2t
	omb1, omb2 := 1-b1, 1-b2
	w, wo := l.values(in), l.values(out)
	n := len(w)
	st, sto := l.state(in), l.state(out)
	m, v, mo, vo := st[:n], st[n:2*n], sto[:n], sto[n:2*n]
	g, wo = g[:n], wo[:n]
	var bad uint32
	for i := range w {
		gi := g[i]
		mi := float32(b1*m[i]) + float32(omb1*gi)
		vi := float32(b2*v[i]) + float32(float32(omb2*gi)*gi)
		x := w[i] - float32(lr*(mi/c1))/(sqrt32(vi/c2)+eps)
		mo[i], vo[i], wo[i] = mi, vi, x
		bad |= finiteBits(mi) | finiteBits(vi) | finiteBits(x)
	}
	return bad
}

// ftrlStep is FTRL-Proximal (McMahan et al. 2013) with learning-rate power
// -1/2, alpha = LR:
//
//	n' = n + g²;  sigma = (sqrt(n') - sqrt(n)) / alpha
//	z += g - sigma*w;  n = n'
//	w = 0 if |z| <= l1, else -(z - sign(z)*l1) / ((beta + sqrt(n))/alpha + l2)
//
// The row's starting value (the initializer's) enters through sigma*w on the
// first step, so a non-zero initialisation is kept, not discarded.
func ftrlStep(o *Optimizer, l layout, in, out, g []float32) uint32 {
	copy(out[:l.hdr], in[:l.hdr])
	w, wo := l.values(in), l.values(out)
	n := len(w)
	st, sto := l.state(in), l.state(out)
	z, acc, zo, acco := st[:n], st[n:2*n], sto[:n], sto[n:2*n]
	g, wo = g[:n], wo[:n]
	alpha, beta, l1, l2 := o.LR, o.Beta, o.L1, o.L2
	var bad uint32
	for i := range w {
		gi := g[i]
		ni := acc[i]
		nn := ni + float32(gi*gi)
		sqn := sqrt32(nn)
		sigma := (sqn - sqrt32(ni)) / alpha
		zi := (z[i] + gi) - float32(sigma*w[i])
		var x float32
		switch {
		case zi > l1:
			x = -(zi - l1) / ((beta+sqn)/alpha + l2)
		case zi < -l1:
			x = -(zi + l1) / ((beta+sqn)/alpha + l2)
		}
		zo[i], acco[i], wo[i] = zi, nn, x
		bad |= finiteBits(zi) | finiteBits(nn) | finiteBits(x)
	}
	return bad
}

// initState writes the optimizer state of a row that has never been pushed.
func initState(o *Optimizer, l layout, row []float32) {
	v := float32(0)
	if o.Kind == Adagrad {
		v = o.InitAcc
	}
	s := l.state(row)
	for i := range s {
		s[i] = v
	}
	if o.Kind == Adam {
		h := adamHeader(row)
		h.step, h.b1t, h.b2t = 0, 1, 1
	}
}

// The initializer is a pure function of (seed, key, column), so replicas create
// identical first values without replicating them, and a pull of a missing key
// can return them without creating the row.

func fmix64(h uint64) uint64 {
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return h
}

func initBits(seed, key uint64, col uint32, draw uint64) uint64 {
	base := fmix64(key ^ fmix64(seed^0x5a17ab1e5eed))
	return fmix64(base + (uint64(col)<<2|draw+1)*0x9e3779b97f4a7c15)
}

// initRow writes the initial values of key's row into w.
func initRow(in Initializer, seed, key uint64, w []float32) {
	switch in.Kind {
	case InitUniform:
		a := in.Scale
		for c := range w {
			// 24 random bits map exactly onto a float32 in [-1, 1).
			u := int32(initBits(seed, key, uint32(c), 0)>>40) - 1<<23
			w[c] = float32(float32(u)*(1.0/(1<<23))) * a
		}
	case InitNormal:
		// Irwin-Hall: the sum of 12 uniforms minus 6 has mean 0 and variance 1,
		// is within 0.01 of the normal CDF everywhere and truncates at ±6σ. It
		// needs only integer adds, so it is the same on every CPU (a Box-Muller
		// would need log and cos). z has at most 21 significant bits and sigma
		// 24, so z*sigma is exact in float64 and is rounded once to float32.
		sigma := float64(in.Scale)
		for c := range w {
			var sum int64
			for d := uint64(0); d < 3; d++ {
				h := initBits(seed, key, uint32(c), d)
				sum += int64(h&0xffff) + int64(h>>16&0xffff) + int64(h>>32&0xffff) + int64(h>>48)
			}
			z := float64(2*sum-12*0xffff) / (2 * 65536)
			w[c] = float32(z * sigma)
		}
	default:
		clear(w)
	}
}
