package trainer

import (
	"bytes"
	"testing"
)

// A synthetic data set written as Criteo TSV reads back sample by sample:
// the same labels, a key in the same fields, and one key per (field, id)
// both ways (two samples share a file key iff they share the planted key).
func TestWriteCriteoRoundTrip(t *testing.T) {
	syn, err := NewSynthetic(DefaultSyntheticConfig())
	if err != nil {
		t.Fatal(err)
	}
	samples := syn.Samples(0, 2000)
	var buf bytes.Buffer
	if err := WriteCriteo(&buf, samples); err != nil {
		t.Fatal(err)
	}
	back, err := ReadAll(NewCriteoReader(&buf))
	if err != nil {
		t.Fatal(err)
	}
	if len(back) != len(samples) {
		t.Fatalf("read %d samples back, wrote %d", len(back), len(samples))
	}
	fileOf := map[uint64]uint64{}
	plantedOf := map[uint64]uint64{}
	for i := range samples {
		s, b := samples[i], back[i]
		if s.Label != b.Label || len(s.Keys) != len(b.Keys) {
			t.Fatalf("sample %d: label %v keys %d, read back label %v keys %d", i, s.Label, len(s.Keys), b.Label, len(b.Keys))
		}
		for j, k := range s.Keys {
			fk := b.Keys[j]
			if KeyField(fk) != KeyField(k) {
				t.Fatalf("sample %d key %d: field %d read back as %d", i, j, KeyField(k), KeyField(fk))
			}
			if f, ok := fileOf[k]; ok && f != fk {
				t.Fatalf("planted key %x read back as %x and %x", k, f, fk)
			}
			if p, ok := plantedOf[fk]; ok && p != k {
				t.Fatalf("file key %x stands for planted keys %x and %x", fk, p, k)
			}
			fileOf[k], plantedOf[fk] = fk, k
		}
	}
}

func TestWriteCriteoRefusesWhatItCannotSpell(t *testing.T) {
	for name, s := range map[string]Sample{
		"field 26":    {Keys: []uint64{MakeKey(26, 1)}},
		"two keys":    {Keys: []uint64{MakeKey(3, 1), MakeKey(3, 2)}},
		"dense":       {Keys: []uint64{MakeKey(0, 1)}, Dense: []float32{1}},
		"label 0.5":   {Label: 0.5},
		"with values": {Keys: []uint64{MakeKey(0, 1)}, Vals: []float32{2}},
	} {
		if err := WriteCriteo(&bytes.Buffer{}, []Sample{s}); err == nil {
			t.Errorf("%s: written without an error", name)
		}
	}
}
