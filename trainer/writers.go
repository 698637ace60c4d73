package trainer

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
)

// WriteCriteo writes samples in the Criteo TSV layout CriteoReader reads:
// the label, the 13 integer columns (empty: the samples here have no
// integer features) and the 26 categorical columns, where a key of field f
// (f < 26) fills column f with its id in hex and a field without a key
// stays empty. Reading the file back gives each (field, id) the key
// MakeKey(f, FNV-1a(hex id)): other numbers than the samples' own keys, but
// one per (field, id), so a model learns the same thing from either. A
// sample with dense features, values other than 1, two keys of one field or
// a field past 25 has no Criteo spelling and is an error.
func WriteCriteo(w io.Writer, samples []Sample) error {
	bw := bufio.NewWriterSize(w, 1<<16)
	var cols [CriteoCategorical][]byte
	line := make([]byte, 0, 256)
	for i, s := range samples {
		if s.Dense != nil || s.Vals != nil {
			return fmt.Errorf("trainer: criteo sample %d: dense features or key values cannot be written", i)
		}
		for f := range cols {
			cols[f] = cols[f][:0]
		}
		for _, k := range s.Keys {
			f := KeyField(k)
			if f >= CriteoCategorical {
				return fmt.Errorf("trainer: criteo sample %d: key of field %d, the format has %d", i, f, CriteoCategorical)
			}
			if len(cols[f]) > 0 {
				return fmt.Errorf("trainer: criteo sample %d: two keys of field %d", i, f)
			}
			cols[f] = strconv.AppendUint(cols[f], KeyID(k), 16)
		}
		line = line[:0]
		switch s.Label {
		case 0:
			line = append(line, '0')
		case 1:
			line = append(line, '1')
		default:
			return fmt.Errorf("trainer: criteo sample %d: label %v, want 0 or 1", i, s.Label)
		}
		for range CriteoDense {
			line = append(line, '\t')
		}
		for f := range cols {
			line = append(line, '\t')
			line = append(line, cols[f]...)
		}
		line = append(line, '\n')
		if _, err := bw.Write(line); err != nil {
			return fmt.Errorf("trainer: writing criteo: %w", err)
		}
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("trainer: writing criteo: %w", err)
	}
	return nil
}

// SyntheticFile is what WriteSyntheticFile writes beside the data
// (PATH.json): enough to know what a model trained on the file should
// reach.
type SyntheticFile struct {
	Examples int     `json:"examples"`
	Seed     uint64  `json:"seed"`
	Fields   int     `json:"fields"`
	Vocab    int     `json:"vocab"`
	HoldOut  float64 `json:"holdout"`
	// Train and Eval: the first Train lines train, the last Eval are held
	// out (LoadSpec's split of the same hold-out fraction).
	Train int `json:"train"`
	Eval  int `json:"eval"`
	// The planted model's AUC and logloss on the held-out lines: the best
	// any model can do on them.
	BayesAUC     float64 `json:"bayes_auc"`
	BayesLogLoss float64 `json:"bayes_logloss"`
}

// WriteSyntheticFile writes samples 0..n-1 of the planted-model generator
// of seed, fields and vocab as Criteo TSV at path, and its SyntheticFile at
// path.json, with the Bayes-optimal metrics of the last holdOut of it: the
// file Go (LoadSpec "criteo:PATH") and Python trainers read alike.
func WriteSyntheticFile(path string, n int, seed uint64, fields, vocab int, holdOut float64) (SyntheticFile, error) {
	switch {
	case fields < 1 || fields > CriteoCategorical:
		return SyntheticFile{}, fmt.Errorf("trainer: synthetic file: %d fields, want 1..%d", fields, CriteoCategorical)
	case !(holdOut > 0 && holdOut < 1):
		return SyntheticFile{}, fmt.Errorf("trainer: synthetic file: hold-out %v, want 0 < f < 1", holdOut)
	}
	nEval := int(math.Round(holdOut * float64(n)))
	if nEval < 2 || n-nEval < 1 {
		return SyntheticFile{}, fmt.Errorf("trainer: synthetic file: %d examples are too few to hold out %v of them (want at least 2 held out and 1 to train on)", n, holdOut)
	}
	cfg := DefaultSyntheticConfig()
	cfg.Seed, cfg.Fields, cfg.Vocab = seed, fields, vocab
	syn, err := NewSynthetic(cfg)
	if err != nil {
		return SyntheticFile{}, err
	}
	samples := syn.Samples(0, n)
	if err := writeFile(path, func(w io.Writer) error { return WriteCriteo(w, samples) }); err != nil {
		return SyntheticFile{}, err
	}
	auc, ll := BayesMetrics(samples[n-nEval:])
	info := SyntheticFile{Examples: n, Seed: seed, Fields: fields, Vocab: vocab, HoldOut: holdOut,
		Train: n - nEval, Eval: nEval, BayesAUC: auc, BayesLogLoss: ll}
	err = writeFile(path+".json", func(w io.Writer) error {
		e := json.NewEncoder(w)
		e.SetIndent("", "  ")
		return e.Encode(info)
	})
	return info, err
}

// writeFile writes a file through fn, reporting a failed close.
func writeFile(path string, fn func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := fn(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
