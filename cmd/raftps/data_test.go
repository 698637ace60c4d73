package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/raftps/raftps/trainer"
)

// raftps data synthetic writes a file raftps train --data criteo:FILE reads,
// split as the summary says, with the Bayes-optimal AUC of the held-out part.
func TestDataSynthetic(t *testing.T) {
	out := filepath.Join(t.TempDir(), "syn.tsv")
	var stdout, stderr bytes.Buffer
	if code := run([]string{"data", "synthetic", "--examples", "5000", "--seed", "7", "--out", out, "--json"}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	var info trainer.SyntheticFile
	if err := json.Unmarshal(stdout.Bytes(), &info); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(out + ".json")
	if err != nil {
		t.Fatal(err)
	}
	var side trainer.SyntheticFile
	if err := json.Unmarshal(b, &side); err != nil || side != info {
		t.Fatalf("OUT.json %s (%v), stdout %+v", b, err, info)
	}
	train, eval, err := trainer.LoadSpec("criteo:"+out, info.HoldOut)
	if err != nil {
		t.Fatal(err)
	}
	if len(train) != info.Train || len(eval) != info.Eval || info.Train+info.Eval != 5000 {
		t.Fatalf("LoadSpec splits %d+%d, the summary says %d+%d", len(train), len(eval), info.Train, info.Eval)
	}
	cfg := trainer.DefaultSyntheticConfig()
	cfg.Seed = 7
	syn, err := trainer.NewSynthetic(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if auc, _ := trainer.BayesMetrics(syn.Samples(4500, 500)); auc != info.BayesAUC || auc < 0.7 {
		t.Fatalf("Bayes AUC %v in the summary, %v of samples 4500..4999", info.BayesAUC, auc)
	}
	for _, args := range [][]string{{"data"}, {"data", "synthetic"}, {"data", "synthetic", "--out", out, "--fields", "27"}, {"data", "synthetic", "--out", out, "--examples", "5"}} {
		stderr.Reset()
		if code := run(args, &stdout, &stderr); code == 0 || !strings.Contains(stderr.String(), "raftps data") {
			t.Errorf("%v: exit %d, %q", args, code, stderr.String())
		}
	}
}
