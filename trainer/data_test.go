package trainer

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/raftps/raftps/store"
)

// writeFileData writes n samples of the default synthetic data as a Criteo
// TSV file (the 8 fields as the first categorical columns, the others and
// the integer columns empty) or a libsvm file (key field*100+id, value 1).
func writeFileData(t *testing.T, kind string, n int) string {
	t.Helper()
	s := defaultData(t)
	var b strings.Builder
	for _, x := range s.Samples(0, n) {
		fmt.Fprintf(&b, "%d", int(x.Label))
		switch kind {
		case "criteo":
			b.WriteString(strings.Repeat("\t", CriteoDense))
			for f := range CriteoCategorical {
				b.WriteByte('\t')
				if f < len(x.Keys) {
					fmt.Fprintf(&b, "%08x", KeyID(x.Keys[f]))
				}
			}
		case "libsvm":
			for _, k := range x.Keys {
				fmt.Fprintf(&b, " %d:1", KeyField(k)*100+int(KeyID(k)))
			}
		}
		b.WriteByte('\n')
	}
	path := filepath.Join(t.TempDir(), "data."+kind)
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// Training on a file: LoadSpec holds out the file's tail, the set is read
// in epochs, the model learns the planted signal, and the unknown
// Bayes-optimal values are JSON nulls.
func TestTrainOnFiles(t *testing.T) {
	for _, kind := range []string{"criteo", "libsvm"} {
		t.Run(kind, func(t *testing.T) {
			train, eval, err := LoadSpec(kind+":"+writeFileData(t, kind, 20000), 0.1)
			if err != nil {
				t.Fatal(err)
			}
			if len(train) != 18000 || len(eval) != 2000 {
				t.Fatalf("%d training and %d held-out samples, want 18000 and 2000", len(train), len(eval))
			}
			sh, err := ShapeOf(train)
			if err != nil {
				t.Fatal(err)
			}
			ada := store.DefaultOptimizer(store.Adagrad)
			ada.LR = 0.2
			ps := newStorePS(t, store.TableConfig{Name: "lr", Dim: 1, Optimizer: ada})
			// 400 steps of 64 is more than one epoch of 18000.
			res, err := Train(context.Background(), LoopConfig{PS: ps, Table: "lr", Model: LR{DenseIn: sh.DenseIn}, Data: train, Eval: eval, Batch: 64, Steps: 400, DenseLR: 0.5})
			if err != nil {
				t.Fatal(err)
			}
			e := lastEval(t, res)
			t.Logf("%s (%d fields, %d dense): AUC %.4f logloss %.4f", kind, sh.Fields, sh.DenseIn, e.AUC, e.LogLoss)
			if e.AUC < 0.72 {
				t.Errorf("AUC %.4f on the planted data, want above 0.72", e.AUC)
			}
			if !math.IsNaN(float64(e.BayesAUC)) {
				t.Errorf("Bayes AUC %v on file data, want unknown", e.BayesAUC)
			}
			j, err := json.Marshal(e)
			if err != nil || !strings.Contains(string(j), `"bayes_auc":null`) {
				t.Errorf("JSON %s, %v; want bayes_auc null", j, err)
			}
		})
	}
}

func TestLoadSpecErrors(t *testing.T) {
	good := writeFileData(t, "libsvm", 100)
	bad := filepath.Join(t.TempDir(), "bad")
	if err := os.WriteFile(bad, []byte("1 3:1\nx 4:1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		spec    string
		holdOut float64
		want    string
	}{
		{"csv:" + good, 0.1, "want criteo:PATH or libsvm:PATH"},
		{"libsvm:", 0.1, "want criteo:PATH or libsvm:PATH"},
		{"libsvm:" + good, 0, "held-out fraction"},
		{"libsvm:" + good, 1, "held-out fraction"},
		{"libsvm:/does/not/exist", 0.1, "no such file"},
		{"libsvm:" + bad, 0.1, "line 2"},
		{"libsvm:" + good, 0.001, "too few"},
	} {
		if _, _, err := LoadSpec(tc.spec, tc.holdOut); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("LoadSpec(%q, %v) = %v, want an error containing %q", tc.spec, tc.holdOut, err, tc.want)
		}
	}
}

func TestSampleSetWraps(t *testing.T) {
	set := SampleSet{{Label: 0}, {Label: 1}, {Label: 0}}
	got := set.Samples(2, 4)
	want := []float32{0, 0, 1, 0}
	for i := range got {
		if got[i].Label != want[i] {
			t.Fatalf("Samples(2, 4) labels %v..., want %v", got[i].Label, want)
		}
	}
	if _, err := ShapeOf([]Sample{{Dense: []float32{1}}, {}}); err == nil {
		t.Fatal("ShapeOf accepted samples with different dense lengths")
	}
}
