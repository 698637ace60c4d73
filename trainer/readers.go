package trainer

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"strconv"
)

// ErrFormat is wrapped by every reader error about malformed input; the
// message names the line.
var ErrFormat = errors.New("trainer: malformed input")

// maxLine bounds one input line.
const maxLine = 16 << 20

// Criteo's display-advertising TSV layout.
const (
	CriteoDense       = 13
	CriteoCategorical = 26
	criteoColumns     = 1 + CriteoDense + CriteoCategorical
)

// CriteoReader reads the Criteo TSV format: per line a label (0 or 1), 13
// integer features and 26 categorical features (hex strings), tab-separated;
// any feature may be empty (missing).
//
// Categorical feature c (0..25) with value v becomes the key
// MakeKey(c, FNV-1a-64(v)) (the hash truncated to 56 bits); a missing one
// gives no key, so that field's bag is empty. Keys have no values (all 1).
// Integer feature x becomes the dense feature log(1+x) when x > 0 and 0 when
// x <= 0 or missing (Criteo has a few negative values), the customary
// transform for these count-like features.
type CriteoReader struct {
	sc   *bufio.Scanner
	line int
}

// NewCriteoReader reads from r.
func NewCriteoReader(r io.Reader) *CriteoReader {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxLine)
	return &CriteoReader{sc: sc}
}

// Read returns the next sample, or io.EOF after the last. Empty lines are
// skipped. An error wrapping ErrFormat names the offending line (1-based).
func (cr *CriteoReader) Read() (Sample, error) {
	for cr.sc.Scan() {
		cr.line++
		line := bytes.TrimSuffix(cr.sc.Bytes(), []byte("\r"))
		if len(line) == 0 {
			continue
		}
		s, err := parseCriteo(line)
		if err != nil {
			return Sample{}, fmt.Errorf("%w: criteo line %d: %v", ErrFormat, cr.line, err)
		}
		return s, nil
	}
	if err := cr.sc.Err(); err != nil {
		return Sample{}, fmt.Errorf("trainer: criteo after line %d: %w", cr.line, err)
	}
	return Sample{}, io.EOF
}

func parseCriteo(line []byte) (Sample, error) {
	cols := bytes.Split(line, []byte("\t"))
	if len(cols) != criteoColumns {
		return Sample{}, fmt.Errorf("%d tab-separated columns, want %d", len(cols), criteoColumns)
	}
	s := Sample{
		Dense: make([]float32, CriteoDense),
		Keys:  make([]uint64, 0, CriteoCategorical),
		Prob:  math.NaN(),
	}
	switch string(cols[0]) {
	case "0":
	case "1":
		s.Label = 1
	default:
		return Sample{}, fmt.Errorf("label %q, want 0 or 1", cols[0])
	}
	for j := range CriteoDense {
		c := cols[1+j]
		if len(c) == 0 {
			continue
		}
		x, err := strconv.ParseInt(string(c), 10, 64)
		if err != nil {
			return Sample{}, fmt.Errorf("integer feature %d: %q is not an integer", j+1, c)
		}
		if x > 0 {
			s.Dense[j] = float32(math.Log1p(float64(x)))
		}
	}
	for j := range CriteoCategorical {
		c := cols[1+CriteoDense+j]
		if len(c) == 0 {
			continue
		}
		h := fnv.New64a()
		h.Write(c)
		s.Keys = append(s.Keys, MakeKey(j, h.Sum64()))
	}
	return s, nil
}

// LibSVMReader reads the libsvm format: per line a label followed by
// space-separated index:value pairs, e.g. "1 3:0.5 17:1". The label is 0 or 1,
// or -1 or +1 (-1 becomes 0). Index i becomes key i of field 0 (so i must be
// below 2^56) with value val. Text after '#' is a comment; blank lines are
// skipped. libsvm files have no dense features.
type LibSVMReader struct {
	sc   *bufio.Scanner
	line int
}

// NewLibSVMReader reads from r.
func NewLibSVMReader(r io.Reader) *LibSVMReader {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxLine)
	return &LibSVMReader{sc: sc}
}

// Read returns the next sample, or io.EOF after the last. An error wrapping
// ErrFormat names the offending line (1-based).
func (lr *LibSVMReader) Read() (Sample, error) {
	for lr.sc.Scan() {
		lr.line++
		line := lr.sc.Bytes()
		if i := bytes.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		fields := bytes.Fields(line)
		if len(fields) == 0 {
			continue
		}
		s, err := parseLibSVM(fields)
		if err != nil {
			return Sample{}, fmt.Errorf("%w: libsvm line %d: %v", ErrFormat, lr.line, err)
		}
		return s, nil
	}
	if err := lr.sc.Err(); err != nil {
		return Sample{}, fmt.Errorf("trainer: libsvm after line %d: %w", lr.line, err)
	}
	return Sample{}, io.EOF
}

func parseLibSVM(fields [][]byte) (Sample, error) {
	s := Sample{Prob: math.NaN()}
	switch string(fields[0]) {
	case "0", "-1":
	case "1", "+1":
		s.Label = 1
	default:
		return Sample{}, fmt.Errorf("label %q, want 0, 1, -1 or +1", fields[0])
	}
	n := len(fields) - 1
	s.Keys = make([]uint64, 0, n)
	s.Vals = make([]float32, 0, n)
	for _, f := range fields[1:] {
		is, vs, ok := bytes.Cut(f, []byte(":"))
		if !ok {
			return Sample{}, fmt.Errorf("feature %q is not index:value", f)
		}
		idx, err := strconv.ParseUint(string(is), 10, 64)
		if err != nil || idx > KeyIDMask {
			return Sample{}, fmt.Errorf("feature %q: index is not an integer in [0, 2^56)", f)
		}
		val, err := strconv.ParseFloat(string(vs), 32)
		if err != nil || math.IsNaN(val) || math.IsInf(val, 0) {
			return Sample{}, fmt.Errorf("feature %q: value is not a finite number", f)
		}
		s.Keys = append(s.Keys, MakeKey(0, idx))
		s.Vals = append(s.Vals, float32(val))
	}
	return s, nil
}

// Reader is a source of samples: CriteoReader, LibSVMReader.
type Reader interface {
	// Read returns the next sample, or io.EOF after the last.
	Read() (Sample, error)
}

// ReadAll reads every sample of r.
func ReadAll(r Reader) ([]Sample, error) {
	var out []Sample
	for {
		s, err := r.Read()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		out = append(out, s)
	}
}
