package trainer

import (
	"errors"
	"hash/fnv"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// readFile writes content to a file in t.TempDir and reads it back with the
// reader made by open.
func readFile(t *testing.T, content string, open func(io.Reader) Reader) ([]Sample, error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "data")
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	return ReadAll(open(f))
}

func openCriteo(r io.Reader) Reader { return NewCriteoReader(r) }
func openLibSVM(r io.Reader) Reader { return NewLibSVMReader(r) }

func criteoLine(label string, ints []string, cats []string) string {
	return label + "\t" + strings.Join(ints, "\t") + "\t" + strings.Join(cats, "\t")
}

func fnvKey(field int, v string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(v))
	return MakeKey(field, h.Sum64())
}

func TestCriteoReader(t *testing.T) {
	ints := make([]string, CriteoDense)
	cats := make([]string, CriteoCategorical)
	for i := range ints {
		ints[i] = "0"
	}
	ints[0], ints[1], ints[2] = "1", "-2", "" // log(2), negative, missing
	ints[12] = "99"
	for i := range cats {
		cats[i] = "68fd1e64"
	}
	cats[3] = ""          // missing
	cats[25] = "deadbeef" // last field
	line1 := criteoLine("1", ints, cats)
	allMissing := criteoLine("0", make([]string, CriteoDense), make([]string, CriteoCategorical))
	samples, err := readFile(t, line1+"\r\n\n"+allMissing+"\n", openCriteo)
	if err != nil {
		t.Fatal(err)
	}
	if len(samples) != 2 {
		t.Fatalf("read %d samples, want 2", len(samples))
	}
	s := samples[0]
	if s.Label != 1 || !math.IsNaN(s.Prob) || s.Vals != nil {
		t.Errorf("label %v prob %v vals %v, want 1, NaN, nil", s.Label, s.Prob, s.Vals)
	}
	wantDense := make([]float32, CriteoDense)
	wantDense[0] = float32(math.Log(2))
	wantDense[12] = float32(math.Log(100))
	for i := range wantDense {
		if math.Abs(float64(s.Dense[i]-wantDense[i])) > 1e-6 {
			t.Errorf("dense[%d] = %v, want %v", i, s.Dense[i], wantDense[i])
		}
	}
	if len(s.Keys) != CriteoCategorical-1 {
		t.Fatalf("%d keys, want %d (one missing)", len(s.Keys), CriteoCategorical-1)
	}
	if s.Keys[0] != fnvKey(0, "68fd1e64") || s.Keys[3] != fnvKey(4, "68fd1e64") || s.Keys[24] != fnvKey(25, "deadbeef") {
		t.Errorf("keys %x", s.Keys)
	}
	seen := map[uint64]bool{}
	for _, k := range s.Keys {
		if seen[k] {
			t.Errorf("key %x twice: same value in two fields must give two keys", k)
		}
		seen[k] = true
	}
	if s := samples[1]; s.Label != 0 || len(s.Keys) != 0 || len(s.Dense) != CriteoDense {
		t.Errorf("all-missing line: label %v, %d keys, %d dense", s.Label, len(s.Keys), len(s.Dense))
	}
}

func TestCriteoReaderErrors(t *testing.T) {
	ints := make([]string, CriteoDense)
	cats := make([]string, CriteoCategorical)
	good := criteoLine("0", ints, cats)
	badInts := append([]string(nil), ints...)
	badInts[4] = "1.5"
	for _, tc := range []struct {
		name, line, want string
	}{
		{"too few columns", "1\t2\t3", "3 tab-separated columns, want 40"},
		{"too many columns", good + "\tx", "41 tab-separated columns"},
		{"bad label", criteoLine("2", ints, cats), `label "2"`},
		{"missing label", criteoLine("", ints, cats), `label ""`},
		{"bad integer", criteoLine("1", badInts, cats), `integer feature 5: "1.5"`},
	} {
		_, err := readFile(t, good+"\n"+good+"\n"+tc.line+"\n"+good+"\n", openCriteo)
		if !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), "line 3") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want ErrFormat naming line 3 and %q", tc.name, err, tc.want)
		}
	}
}

func TestLibSVMReader(t *testing.T) {
	content := "# header comment\n" +
		"1 3:0.5 17:1\n" +
		"-1 2:-2.5e-1  # trailing comment\n" +
		"\n" +
		"+1\n" +
		"0 72057594037927935:3\n"
	samples, err := readFile(t, content, openLibSVM)
	if err != nil {
		t.Fatal(err)
	}
	want := []Sample{
		{Label: 1, Keys: []uint64{3, 17}, Vals: []float32{0.5, 1}},
		{Label: 0, Keys: []uint64{2}, Vals: []float32{-0.25}},
		{Label: 1, Keys: []uint64{}, Vals: []float32{}},
		{Label: 0, Keys: []uint64{KeyIDMask}, Vals: []float32{3}},
	}
	if len(samples) != len(want) {
		t.Fatalf("read %d samples, want %d", len(samples), len(want))
	}
	for i, w := range want {
		s := samples[i]
		if s.Label != w.Label || !equalU64(s.Keys, w.Keys) || !equalF32(s.Vals, w.Vals) || s.Dense != nil || !math.IsNaN(s.Prob) {
			t.Errorf("sample %d = %+v, want %+v", i, s, w)
		}
	}
}

func TestLibSVMReaderErrors(t *testing.T) {
	for _, tc := range []struct {
		name, line, want string
	}{
		{"bad label", "2 1:1", `label "2"`},
		{"no colon", "1 5", `feature "5" is not index:value`},
		{"bad index", "1 x:1", `feature "x:1": index`},
		{"negative index", "1 -3:1", `feature "-3:1": index`},
		{"index too large", "1 72057594037927936:1", "index is not an integer in [0, 2^56)"},
		{"bad value", "1 3:abc", `feature "3:abc": value`},
		{"NaN value", "1 3:NaN", `feature "3:NaN": value`},
		{"missing value", "1 3:", `feature "3:": value`},
	} {
		_, err := readFile(t, "1 1:1\n\n"+tc.line+"\n0 1:1\n", openLibSVM)
		if !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), "line 3") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want ErrFormat naming line 3 and %q", tc.name, err, tc.want)
		}
	}
}

func TestReaderEmptyInput(t *testing.T) {
	for name, open := range map[string]func(io.Reader) Reader{"criteo": openCriteo, "libsvm": openLibSVM} {
		samples, err := readFile(t, "", open)
		if err != nil || len(samples) != 0 {
			t.Errorf("%s: empty file gave %d samples, err %v", name, len(samples), err)
		}
	}
}

func equalU64(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func equalF32(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
