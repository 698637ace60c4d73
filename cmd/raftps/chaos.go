package main

import (
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/raftps/raftps/test/chaos"
)

func runChaos(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("raftps chaos", flag.ContinueOnError)
	var cc chaos.Config
	var target, faults, tables string
	var asJSON bool
	fs.StringVar(&target, "target", "", "the cluster: local:DIR (raftps cluster up --dir DIR) or docker:PROJECT (a compose project of deploy/docker-compose.yml)")
	fs.DurationVar(&cc.Duration, "duration", 2*time.Minute, "how long the workload runs")
	fs.DurationVar(&cc.Every, "every", 10*time.Second, "one fault this often, in turn from --faults")
	fs.StringVar(&faults, "faults", "kill-leader,pause-leader", "comma-separated: "+strings.Join(chaos.FaultKinds, ", "))
	fs.StringVar(&tables, "tables", "chaos_lin,chaos_bnd", "tables to run the workload on; created if missing: a name containing \"bnd\" as bounded:100ms, \"evt\" as eventual, any other linearizable; one containing \"chn\" as a chain table, one containing \"hot\" with hot keys at 5 pulls/s and 2 read replicas, one containing \"idl\" without workload (only the probes after faults write to it, so its groups are quiet when a fault hits them; its window is reported as idle tables) (dim 2, SGD lr=1, zeros)")
	fs.IntVar(&cc.Clients, "clients", 3, "workload clients per table (pushes and pulls)")
	fs.IntVar(&cc.Readers, "readers", 1, "pull-only clients per table, whose pulls measure how long a fault leaves reads unanswered")
	fs.DurationVar(&cc.SlowBy, "slow-by", chaos.DefaultSlowBy, "how late a slow-node fault makes its node answer")
	fs.DurationVar(&cc.MaxReadGap, "max-read-gap", chaos.DefaultMaxReadGap, "a single-node fault that leaves a bounded or eventual table without a completed pull this long fails the run")
	fs.IntVar(&cc.Keys, "keys", 32, "keys per table the workload touches")
	fs.DurationVar(&cc.Down, "down", 3*time.Second, "how long a killed, paused or cut-off node stays so before it is healed (shorter than --every)")
	fs.StringVar(&cc.OutDir, "out", "", "directory for the histories and the report (and porcupine's HTML on a failure); default: a new temporary directory")
	fs.Uint64Var(&cc.Seed, "seed", 0, "seed of the fault and workload choices (0: random)")
	fs.BoolVar(&asJSON, "json", false, "print one summary object on stdout")
	if rc := parse(fs, args, stderr); rc >= 0 {
		return rc
	}
	cc.Faults, cc.Tables = splitList(faults), splitList(tables)
	if target == "" {
		return fail(stderr, "chaos", fmt.Errorf("--target is required (local:DIR or docker:PROJECT)"))
	}
	if err := cc.Validate(); err != nil {
		return fail(stderr, "chaos", err)
	}
	t, err := chaos.ParseTarget(target)
	if err != nil {
		return fail(stderr, "chaos", err)
	}
	progress := stdout
	if asJSON {
		progress = stderr
	}
	rep, err := chaos.Run(cc, t, progress)
	if err != nil {
		return fail(stderr, "chaos", err)
	}
	if asJSON {
		_ = printJSON(stdout, rep)
	} else {
		chaos.PrintReport(stdout, rep)
	}
	if len(rep.Violations) > 0 {
		return 1
	}
	return 0
}

// splitList splits a comma-separated flag value, dropping empty entries.
func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}
