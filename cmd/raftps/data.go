package main

import (
	"flag"
	"fmt"
	"io"

	"github.com/raftps/raftps/trainer"
)

func runData(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] != "synthetic" {
		fmt.Fprintln(stderr, "usage: raftps data synthetic --examples N --seed S --out FILE  (raftps data synthetic -h lists its flags)")
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help") {
			return 0
		}
		return 2
	}
	return dataSynthetic(args[1:], stdout, stderr)
}

// dataSynthetic writes samples 0..N-1 of the trainer's planted-model
// generator as Criteo TSV, the format raftps train --data criteo:FILE and
// the Python example read, so Go and Python train on the same bytes.
func dataSynthetic(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("raftps data synthetic", flag.ContinueOnError)
	n := fs.Int("examples", 100_000, "samples to write")
	seed := fs.Uint64("seed", 1, "seed of the planted model and the samples")
	out := fs.String("out", "", "the Criteo TSV file to write (required); its summary goes to OUT.json")
	fields := fs.Int("fields", 8, "categorical fields (at most 26, Criteo's)")
	vocab := fs.Int("vocab", 100, "ids per field")
	holdOut := fs.Float64("holdout", 0.1, "the fraction of the file, from its end, whose Bayes-optimal AUC is reported (raftps train's --holdout)")
	asJSON := fs.Bool("json", false, "print the summary as JSON")
	if rc := parse(fs, args, stderr); rc >= 0 {
		return rc
	}
	if *out == "" {
		return fail(stderr, "data synthetic", fmt.Errorf("--out is required"))
	}
	info, err := trainer.WriteSyntheticFile(*out, *n, *seed, *fields, *vocab, *holdOut)
	if err != nil {
		return fail(stderr, "data synthetic", err)
	}
	if *asJSON {
		_ = printJSON(stdout, info)
		return 0
	}
	fmt.Fprintf(stdout, "wrote %d samples to %s (Criteo TSV); the last %d held out have Bayes-optimal AUC %.4f, logloss %.4f (summary in %s.json)\n",
		info.Examples, *out, info.Eval, info.BayesAUC, info.BayesLogLoss, *out)
	return 0
}
