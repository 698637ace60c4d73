package main

import (
	"flag"
	"fmt"
	"io"

	"github.com/raftps/raftps/test/demo"
)

// runDemo shows what raftps is for, on one machine: a 3-node cluster of
// separate processes, a model trained against it, the leader of a shard
// killed in the middle, and the proof that no acknowledged update was lost.
func runDemo(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("raftps demo", flag.ContinueOnError)
	dir := fs.String("dir", "", "directory for the demo cluster (default: a temporary one, removed at the end)")
	base := fs.Int("base-port", 7301, "client port of the first node")
	steps := fs.Int("steps", 3000, "training steps per trainer (a leader is killed half-way)")
	trainers := fs.Int("trainers", 2, "synchronous trainers")
	keep := fs.Bool("keep", false, "leave the cluster running at the end")
	if rc := parse(fs, args, stderr); rc >= 0 {
		return rc
	}
	if *trainers < 1 || *steps < 1 {
		return fail(stderr, "demo", fmt.Errorf("--trainers and --steps must be at least 1"))
	}
	if err := demo.Run(demo.Config{Dir: *dir, BasePort: *base, Steps: *steps, Trainers: *trainers, Keep: *keep}, stdout); err != nil {
		return fail(stderr, "demo", err)
	}
	return 0
}
