package trainer

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
)

// SyntheticConfig describes a planted CTR model. Every sample has one key per
// field, drawn from a Zipf distribution over the field's vocabulary (id r has
// probability proportional to (r+1)^-ZipfS, so id 0 is the most frequent).
// Its logit is
//
//	z = Bias + sum over its keys of w(key) + sum over pairs of keys of <v(a), v(b)>
//
// and its label is 1 with probability sigmoid(z). The true weight w(key) and
// latent vector v(key) are functions of (Seed, key) computed from a hash, so
// the planted model takes no memory however large the vocabulary.
type SyntheticConfig struct {
	// Seed fixes the planted model and the sample stream.
	Seed uint64
	// Fields is the number of categorical fields, at most MaxFields.
	Fields int
	// Vocab is the number of distinct ids per field.
	Vocab int
	// ZipfS is the Zipf exponent, > 0.
	ZipfS float64
	// TargetCTR, when > 0, is the wanted mean probability of a positive:
	// NewSynthetic then solves for Bias (see Synthetic.Config) on
	// CalibrationSamples samples of a reserved index range, so the positive
	// rate does not depend on the seed. When 0, Bias is used as given.
	TargetCTR float64
	// Bias is the logit's constant term (ignored when TargetCTR > 0).
	Bias float64
	// WeightStd is the standard deviation of the true per-key weights.
	WeightStd float64
	// LatentDim is the length of the latent vectors; 0 turns the pairwise
	// interaction term off (then the planted model is logistic regression).
	LatentDim int
	// LatentStd is the standard deviation of each latent component.
	LatentStd float64
}

// DefaultSyntheticConfig returns the setting raftps train and the demo use:
// 8 fields of 100 ids, Zipf exponent 1.1, no interactions, true weights with
// standard deviation 0.5, 25% positives and a Bayes-optimal AUC of about 0.81
// (see TestSyntheticCalibration). It has Criteo's label balance and
// difficulty but a vocabulary a model learns in a few thousand steps, so a
// run can show how close training comes to the Bayes-optimal AUC.
func DefaultSyntheticConfig() SyntheticConfig {
	return SyntheticConfig{
		Seed:      1,
		Fields:    8,
		Vocab:     100,
		ZipfS:     1.1,
		TargetCTR: 0.25,
		WeightStd: 0.5,
	}
}

// CriteoScaleSyntheticConfig returns Criteo's shape: 26 fields of 100,000
// ids, Zipf exponent 1.1, no interactions, 25% positives and a Bayes-optimal
// AUC of about 0.8. Most of its ids are rare, so models need millions of
// samples to approach the Bayes-optimal AUC (logistic regression reaches
// about 0.74 after one million).
func CriteoScaleSyntheticConfig() SyntheticConfig {
	return SyntheticConfig{
		Seed:      1,
		Fields:    26,
		Vocab:     100_000,
		ZipfS:     1.1,
		TargetCTR: 0.25,
		WeightStd: 0.27,
	}
}

// CalibrationSamples is the number of samples NewSynthetic solves Bias on
// when TargetCTR > 0. They are samples CalibrationStart, CalibrationStart+1,
// ... of the generator (labels unused); do not use that range for training.
const (
	CalibrationSamples        = 20_000
	CalibrationStart   uint64 = 1 << 63
)

// Validate reports the first invalid field of c.
func (c SyntheticConfig) Validate() error {
	switch {
	case c.Fields < 1 || c.Fields > MaxFields:
		return fmt.Errorf("trainer: synthetic Fields (%d) must be in [1, %d]", c.Fields, MaxFields)
	case c.Vocab < 1 || c.Vocab > 1<<26:
		return fmt.Errorf("trainer: synthetic Vocab (%d) must be in [1, %d]", c.Vocab, 1<<26)
	case !(c.ZipfS > 0) || math.IsInf(c.ZipfS, 0):
		return fmt.Errorf("trainer: synthetic ZipfS (%v) must be a positive number", c.ZipfS)
	case !(c.TargetCTR >= 0 && c.TargetCTR < 1):
		return fmt.Errorf("trainer: synthetic TargetCTR (%v) must be in [0, 1)", c.TargetCTR)
	case math.IsNaN(c.Bias) || math.IsInf(c.Bias, 0):
		return fmt.Errorf("trainer: synthetic Bias (%v) must be finite", c.Bias)
	case !(c.WeightStd >= 0) || math.IsInf(c.WeightStd, 0):
		return fmt.Errorf("trainer: synthetic WeightStd (%v) must be finite and >= 0", c.WeightStd)
	case c.LatentDim < 0 || c.LatentDim > 1024:
		return fmt.Errorf("trainer: synthetic LatentDim (%d) must be in [0, 1024]", c.LatentDim)
	case !(c.LatentStd >= 0) || math.IsInf(c.LatentStd, 0):
		return fmt.Errorf("trainer: synthetic LatentStd (%v) must be finite and >= 0", c.LatentStd)
	}
	return nil
}

// Synthetic generates samples from a planted model. Sample i is a function of
// (config, i) only, so disjoint index ranges are independent sample sets of
// the same model (a training set and a test set, or one shard per trainer),
// and any range can be regenerated on any machine. Its methods are safe for
// concurrent use.
//
// Keys and the planted weights are computed with integer hashing and
// explicitly rounded float64 arithmetic, so they are the same on every
// machine; the Zipf table uses math.Pow and a label compares a uniform draw
// with sigmoid(z) (math.Exp), so an id or a label could differ between
// architectures only if a draw fell within the last bit of those functions.
type Synthetic struct {
	cfg SyntheticConfig
	cdf []float64 // cdf[r] = P(id <= r); cdf[Vocab-1] == 1
}

// NewSynthetic checks cfg and builds its Zipf table (8 bytes per id of one
// field; every field shares it).
func NewSynthetic(cfg SyntheticConfig) (*Synthetic, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cdf := make([]float64, cfg.Vocab)
	var sum float64
	for r := range cdf {
		sum += math.Pow(float64(r+1), -cfg.ZipfS)
		cdf[r] = sum
	}
	for r := range cdf {
		cdf[r] /= sum
	}
	cdf[len(cdf)-1] = 1
	s := &Synthetic{cfg: cfg, cdf: cdf}
	if cfg.TargetCTR > 0 {
		s.calibrate()
	}
	return s, nil
}

// calibrate sets Bias so that the mean of sigmoid(z) over the calibration
// samples is TargetCTR, by bisection (the mean grows with Bias).
func (s *Synthetic) calibrate() {
	s.cfg.Bias = 0
	zs := make([]float64, CalibrationSamples)
	for j := range zs {
		zs[j] = s.Logit(s.keys(s.rng(CalibrationStart + uint64(j))))
	}
	lo, hi := -40.0, 40.0
	for range 60 {
		mid := (lo + hi) / 2
		var sum float64
		for _, z := range zs {
			sum += sigmoid(z + mid)
		}
		if sum/float64(len(zs)) < s.cfg.TargetCTR {
			lo = mid
		} else {
			hi = mid
		}
	}
	s.cfg.Bias = (lo + hi) / 2
}

// Config returns the generator's config, with Bias set to the solved value
// when TargetCTR > 0.
func (s *Synthetic) Config() SyntheticConfig { return s.cfg }

// Sample returns sample i: one key per field in field order, no values, no
// dense features, its label and its true probability.
func (s *Synthetic) Sample(i uint64) Sample {
	r := s.rng(i)
	keys := s.keys(r)
	p := sigmoid(s.Logit(keys))
	label := float32(0)
	if r.Float64() < p {
		label = 1
	}
	return Sample{Label: label, Keys: keys, Prob: p}
}

// rng returns the random stream of sample i.
func (s *Synthetic) rng(i uint64) *rand.Rand {
	return rand.New(rand.NewPCG(s.cfg.Seed^0x5eed5a3b1e5eed00, i))
}

// keys draws one key per field from r.
func (s *Synthetic) keys(r *rand.Rand) []uint64 {
	keys := make([]uint64, s.cfg.Fields)
	for f := range keys {
		u := r.Float64()
		id := sort.Search(len(s.cdf), func(j int) bool { return s.cdf[j] > u })
		if id == len(s.cdf) {
			id--
		}
		keys[f] = MakeKey(f, uint64(id))
	}
	return keys
}

// Samples returns samples start, start+1, ..., start+n-1.
func (s *Synthetic) Samples(start uint64, n int) []Sample {
	out := make([]Sample, n)
	for j := range out {
		out[j] = s.Sample(start + uint64(j))
	}
	return out
}

// Weight returns the true weight of key.
func (s *Synthetic) Weight(key uint64) float64 {
	return float64(s.cfg.WeightStd * gaussianish(mix64(s.cfg.Seed^0x77e16470, key, 0))) // rounded: no FMA with the caller's sum
}

// Latent writes the true latent vector of key into out, which must have
// LatentDim elements.
func (s *Synthetic) Latent(key uint64, out []float64) {
	for c := range out {
		out[c] = float64(s.cfg.LatentStd * gaussianish(mix64(s.cfg.Seed^0x1a7e47, key, uint64(c)+1)))
	}
}

// Logit returns the planted model's logit for a sample with these keys (all
// values 1).
func (s *Synthetic) Logit(keys []uint64) float64 {
	z := s.cfg.Bias
	for _, k := range keys {
		z = z + s.Weight(k)
	}
	if d := s.cfg.LatentDim; d > 0 {
		// sum over pairs <v_a, v_b> = (|sum v|^2 - sum |v|^2) / 2
		sum := make([]float64, d)
		v := make([]float64, d)
		var sq float64
		for _, k := range keys {
			s.Latent(k, v)
			for c := range v {
				sum[c] = sum[c] + v[c]
				sq = sq + float64(v[c]*v[c])
			}
		}
		var tot float64
		for c := range sum {
			tot = tot + float64(sum[c]*sum[c])
		}
		z = z + float64(tot-sq)/2
	}
	return z
}

// mix64 hashes (seed, key, c) to 64 well-mixed bits.
func mix64(seed, key, c uint64) uint64 {
	return fmix64(fmix64(seed^fmix64(key)) + c*0x9e3779b97f4a7c15)
}

// fmix64 is MurmurHash3's 64-bit finalizer, a bijection.
func fmix64(k uint64) uint64 {
	k ^= k >> 33
	k *= 0xff51afd7ed558ccd
	k ^= k >> 33
	k *= 0xc4ceb9fe1a85ec53
	k ^= k >> 33
	return k
}

// gaussianish turns 64 random bits into a value of mean 0 and variance 1 with
// a bell-shaped distribution: the scaled sum of four 16-bit uniforms
// (Irwin-Hall), which needs no transcendental function and so is the same on
// every machine.
func gaussianish(h uint64) float64 {
	var s uint64
	for range 4 {
		s += h & 0xffff
		h >>= 16
	}
	// Each uniform (u+0.5)/65536 has mean 1/2 and variance ~1/12; the sum of
	// four has mean 2 and variance 1/3.
	const scale = 1.7320508075688772 // sqrt(3)
	return (float64(s)/65536 + 4/65536.0*0.5 - 2) * scale
}
