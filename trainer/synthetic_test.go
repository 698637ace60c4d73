package trainer

import (
	"math"
	"testing"
)

func TestSyntheticCalibration(t *testing.T) {
	for name, cfg := range map[string]SyntheticConfig{"default": DefaultSyntheticConfig(), "criteo-scale": CriteoScaleSyntheticConfig()} {
		t.Run(name, func(t *testing.T) { checkCalibration(t, cfg) })
	}
}

func checkCalibration(t *testing.T, cfg SyntheticConfig) {
	s, err := NewSynthetic(cfg)
	if err != nil {
		t.Fatal(err)
	}
	const n = 200_000
	samples := s.Samples(0, n)
	var pos float64
	for i := range samples {
		pos += float64(samples[i].Label)
	}
	rate := pos / n
	auc, ll := BayesMetrics(samples)
	t.Logf("positives %.4f, Bayes AUC %.4f, Bayes logloss %.4f", rate, auc, ll)
	if rate < 0.22 || rate > 0.28 {
		t.Errorf("positive rate %.4f outside [0.22, 0.28]", rate)
	}
	if auc < 0.75 || auc > 0.85 {
		t.Errorf("Bayes AUC %.4f outside [0.75, 0.85]", auc)
	}
}

// TestSyntheticCalibrationSeeds checks that the calibration holds for other
// seeds (fewer samples, wider bounds).
func TestSyntheticCalibrationSeeds(t *testing.T) {
	for _, seed := range []uint64{2, 3} {
		cfg := DefaultSyntheticConfig()
		cfg.Seed = seed
		s, err := NewSynthetic(cfg)
		if err != nil {
			t.Fatal(err)
		}
		samples := s.Samples(0, 50_000)
		var pos float64
		for i := range samples {
			pos += float64(samples[i].Label)
		}
		auc, _ := BayesMetrics(samples)
		t.Logf("seed %d: bias %.4f, positives %.4f, Bayes AUC %.4f", seed, s.Config().Bias, pos/50_000, auc)
		if r := pos / 50_000; r < 0.22 || r > 0.28 || auc < 0.75 || auc > 0.85 {
			t.Errorf("seed %d: positives %.4f, Bayes AUC %.4f", seed, r, auc)
		}
	}
}

func TestSyntheticDeterministic(t *testing.T) {
	a, _ := NewSynthetic(DefaultSyntheticConfig())
	b, _ := NewSynthetic(DefaultSyntheticConfig())
	cfg := DefaultSyntheticConfig()
	cfg.Seed = 2
	c, _ := NewSynthetic(cfg)
	if a.Config().Bias != b.Config().Bias {
		t.Fatalf("bias %v then %v", a.Config().Bias, b.Config().Bias)
	}
	same := 0
	for _, i := range []uint64{0, 1, 1000, 1 << 40} {
		x, y, z := a.Sample(i), b.Sample(i), c.Sample(i)
		if !equalU64(x.Keys, y.Keys) || x.Label != y.Label || x.Prob != y.Prob {
			t.Errorf("sample %d differs between two generators of the same config", i)
		}
		if x.Prob == z.Prob {
			same++
		}
	}
	if same > 0 {
		t.Errorf("%d samples have the same probability under seeds 1 and 2", same)
	}
	if got := a.Samples(1000, 1)[0]; !equalU64(got.Keys, a.Sample(1000).Keys) {
		t.Error("Samples(1000, 1) differs from Sample(1000)")
	}
}

// TestSyntheticGolden pins the generator's output for the Criteo-scale config, so
// a change that would alter every data set (and every recorded result) is
// noticed. Update the digest only on purpose.
func TestSyntheticGolden(t *testing.T) {
	s, _ := NewSynthetic(CriteoScaleSyntheticConfig())
	var h uint64
	for i := range uint64(1000) {
		x := s.Sample(i)
		for _, k := range x.Keys {
			h = fmix64(h ^ k)
		}
		h = fmix64(h ^ uint64(x.Label))
	}
	const want = 0x22987bb958fa4784
	if h != want {
		t.Errorf("digest of the first 1000 samples = %#x, want %#x; bias %v", h, uint64(want), s.Config().Bias)
	}
}

func TestSyntheticKeys(t *testing.T) {
	cfg := DefaultSyntheticConfig()
	cfg.Vocab = 1000
	s, _ := NewSynthetic(cfg)
	counts := make(map[uint64]int)
	const n = 20_000
	for i := range uint64(n) {
		x := s.Sample(i)
		if len(x.Keys) != cfg.Fields || x.Vals != nil || x.Dense != nil {
			t.Fatalf("sample %d: %d keys, vals %v, dense %v", i, len(x.Keys), x.Vals, x.Dense)
		}
		for f, k := range x.Keys {
			if KeyField(k) != f || KeyID(k) >= uint64(cfg.Vocab) {
				t.Fatalf("sample %d key %d = %#x: field %d id %d", i, f, k, KeyField(k), KeyID(k))
			}
			counts[k]++
		}
	}
	// Zipf(1.1) over 1000 ids: P(0) = 1/H, P(1)/P(0) = 2^-1.1.
	var hsum float64
	for r := 1; r <= cfg.Vocab; r++ {
		hsum += math.Pow(float64(r), -1.1)
	}
	p0 := 1 / hsum
	for f := range cfg.Fields {
		got0 := float64(counts[MakeKey(f, 0)]) / n
		got1 := float64(counts[MakeKey(f, 1)]) / n
		if math.Abs(got0-p0) > 0.02 || math.Abs(got1-p0*math.Pow(2, -1.1)) > 0.02 {
			t.Errorf("field %d: P(id 0) = %.3f, P(id 1) = %.3f; want %.3f, %.3f", f, got0, got1, p0, p0*math.Pow(2, -1.1))
		}
	}
}

// TestSyntheticLogit checks the planted model against its definition,
// including the pairwise interaction term.
func TestSyntheticLogit(t *testing.T) {
	cfg := SyntheticConfig{Seed: 5, Fields: 4, Vocab: 50, ZipfS: 1.1, Bias: -0.5, WeightStd: 0.4, LatentDim: 3, LatentStd: 0.3}
	s, err := NewSynthetic(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for i := range uint64(20) {
		x := s.Sample(i)
		want := cfg.Bias
		vs := make([][]float64, len(x.Keys))
		for a, k := range x.Keys {
			want += s.Weight(k)
			vs[a] = make([]float64, cfg.LatentDim)
			s.Latent(k, vs[a])
		}
		for a := range vs {
			for b := a + 1; b < len(vs); b++ {
				for c := range vs[a] {
					want += vs[a][c] * vs[b][c]
				}
			}
		}
		if got := s.Logit(x.Keys); math.Abs(got-want) > 1e-12 || math.Abs(x.Prob-sigmoid(want)) > 1e-12 {
			t.Errorf("sample %d: logit %v prob %v, want %v, %v", i, got, x.Prob, want, sigmoid(want))
		}
	}
}

// TestGaussianish checks the mean and variance of the planted weights.
func TestGaussianish(t *testing.T) {
	var sum, sq float64
	const n = 100_000
	for i := range uint64(n) {
		g := gaussianish(fmix64(i))
		sum += g
		sq += g * g
	}
	mean, variance := sum/n, sq/n-(sum/n)*(sum/n)
	if math.Abs(mean) > 0.01 || math.Abs(variance-1) > 0.02 {
		t.Errorf("mean %.4f variance %.4f, want 0 and 1", mean, variance)
	}
}

func TestSyntheticConfigValidate(t *testing.T) {
	for _, mut := range []func(*SyntheticConfig){
		func(c *SyntheticConfig) { c.Fields = 0 },
		func(c *SyntheticConfig) { c.Fields = MaxFields + 1 },
		func(c *SyntheticConfig) { c.Vocab = 0 },
		func(c *SyntheticConfig) { c.ZipfS = 0 },
		func(c *SyntheticConfig) { c.ZipfS = math.NaN() },
		func(c *SyntheticConfig) { c.TargetCTR = 1 },
		func(c *SyntheticConfig) { c.WeightStd = -1 },
		func(c *SyntheticConfig) { c.LatentDim = -1 },
		func(c *SyntheticConfig) { c.Bias = math.Inf(1) },
	} {
		c := DefaultSyntheticConfig()
		mut(&c)
		if _, err := NewSynthetic(c); err == nil {
			t.Errorf("NewSynthetic(%+v) succeeded", c)
		}
	}
}
