package trainer

import (
	"fmt"
	"math"
	"os"
	"strings"
)

// Dataset is where Train reads its samples: *Synthetic (endless) or a
// SampleSet read from a file (read round and round).
type Dataset interface {
	// Samples returns samples first, first+1, ..., first+n-1.
	Samples(first uint64, n int) []Sample
}

var (
	_ Dataset = (*Synthetic)(nil)
	_ Dataset = SampleSet(nil)
)

// SampleSet is a finite Dataset: sample i is s[i mod len(s)], so training
// runs over it in epochs.
type SampleSet []Sample

// Samples returns n samples from first, wrapping around. It panics if s is
// empty.
func (s SampleSet) Samples(first uint64, n int) []Sample {
	out := make([]Sample, n)
	at := first % uint64(len(s))
	for j := range out {
		out[j] = s[at]
		if at++; at == uint64(len(s)) {
			at = 0
		}
	}
	return out
}

// Shape is what a model must accept to train on a data set.
type Shape struct {
	// Fields is one more than the largest field of any key.
	Fields int
	// DenseIn is the number of dense features of every sample.
	DenseIn int
}

// ShapeOf returns the shape of samples, or an error if they disagree on the
// number of dense features.
func ShapeOf(samples []Sample) (Shape, error) {
	var sh Shape
	for i := range samples {
		s := &samples[i]
		if i == 0 {
			sh.DenseIn = len(s.Dense)
		} else if len(s.Dense) != sh.DenseIn {
			return sh, fmt.Errorf("%w: sample %d has %d dense features, sample 0 has %d", ErrFormat, i, len(s.Dense), sh.DenseIn)
		}
		for _, k := range s.Keys {
			sh.Fields = max(sh.Fields, KeyField(k)+1)
		}
	}
	return sh, nil
}

// LoadSpec reads the data set spec of raftps train --data: "criteo:PATH"
// (Criteo TSV) or "libsvm:PATH". The last holdOut fraction of the file's
// samples (0 < holdOut < 1) is returned as the evaluation set, the rest as
// the training set; the split keeps file order, so a file sorted by time
// evaluates on its latest samples, as Criteo's competition did.
func LoadSpec(spec string, holdOut float64) (train SampleSet, eval []Sample, err error) {
	kind, path, ok := strings.Cut(spec, ":")
	if !ok || path == "" || (kind != "criteo" && kind != "libsvm") {
		return nil, nil, fmt.Errorf("trainer: data %q: want criteo:PATH or libsvm:PATH", spec)
	}
	if !(holdOut > 0 && holdOut < 1) {
		return nil, nil, fmt.Errorf("trainer: held-out fraction %v: want 0 < f < 1", holdOut)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, fmt.Errorf("trainer: data: %w", err)
	}
	defer f.Close()
	var r Reader = NewLibSVMReader(f)
	if kind == "criteo" {
		r = NewCriteoReader(f)
	}
	all, err := ReadAll(r)
	if err != nil {
		return nil, nil, fmt.Errorf("trainer: data %s: %w", path, err)
	}
	nEval := int(math.Round(holdOut * float64(len(all))))
	if nEval < 2 || len(all)-nEval < 1 {
		return nil, nil, fmt.Errorf("trainer: data %s: %d samples are too few to hold out %.0f%% for evaluation (want at least 2 held out and 1 to train on)", path, len(all), 100*holdOut)
	}
	return SampleSet(all[:len(all)-nEval]), all[len(all)-nEval:], nil
}
