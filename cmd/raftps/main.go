package main

import (
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"sort"
)

// command is one subcommand. run gets the arguments after the subcommand's
// name and returns the process exit status.
type command struct {
	summary string
	run     func(args []string, stdout, stderr io.Writer) int
}

// commands grows as the packages behind them land: server, table, status,
// train, bench, chaos, demo, checkpoint (../shared/DESIGN.md), and node for
// the elastic cluster's administration.
var commands = map[string]command{
	"version": {"print the build's version and module versions", runVersion},
	"server":  {"run a node: raftps server --id n1 --addr A --data-dir D --bootstrap | --join P,Q | --peers n1=P,n2=Q,n3=R (peer addresses)", runServer},
	"node":    {"change a node's admin state: raftps node drain [--wait]|remove|activate NODE", runNode},
	"table":   {"create, alter, drop, list or describe tables: raftps table create|alter|drop NAME ...", runTable},
	"pull":    {"print rows: raftps pull TABLE KEY...", runPull},
	"status":  {"show nodes (liveness, admin state, replicas, leaders, pulls served), shards being moved, every replica's state, and with --hot the hot keys", runStatus},
	"bench":   {"measure pull/push rows/s and latency against a cluster", runBench},
	"demo":    {"a local 3-node cluster, a workload, a leader killed mid-run, and the proof nothing was lost", runDemo},
	"train":   {"train a CTR model on synthetic data against the cluster: raftps train --model lr|dlrm", runTrain},
	"chaos":   {"inject faults into a cluster under a checked workload and report what was lost: raftps chaos --target local:DIR|docker:PROJECT", runChaos},
	"cluster": {"run a local cluster of separate processes: raftps cluster up|add|down|kill NODE|restart NODE --dir D", runCluster},
	"token":   {"make, list and revoke bearer tokens (admin): raftps token create --name N --role reader|writer|admin | list | revoke ID|NAME", runToken},
	"cert":    {"make and list certificates: raftps cert create-ca|create-node|create-client|list --certs-dir D", runCert},
	"data":    {"write data sets: raftps data synthetic --examples N --seed S --out FILE (Criteo TSV of the planted model, with its Bayes-optimal AUC)", runData},
	"health":  {"exit 0 if a node's /healthz answers 200 (for container healthchecks): raftps health [--http ADDR]", runHealth},
}

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		usage(stdout)
		return 0
	}
	cmd, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "raftps: unknown command %q\n\n", args[0])
		usage(stderr)
		return 2
	}
	return cmd.run(args[1:], stdout, stderr)
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "raftps: a Raft-replicated parameter server for embedding tables.")
	fmt.Fprintln(w, "\nUsage: raftps COMMAND [flags]\n\nCommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-12s %s\n", n, commands[n].summary)
	}
}

func runVersion(args []string, stdout, stderr io.Writer) int {
	if len(args) != 0 {
		fmt.Fprintln(stderr, "raftps version: takes no arguments")
		return 2
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		fmt.Fprintln(stdout, "raftps (no build info)")
		return 0
	}
	fmt.Fprintf(stdout, "raftps %s (%s)\n", bi.Main.Version, bi.GoVersion)
	for _, d := range bi.Deps {
		fmt.Fprintf(stdout, "  %s %s\n", d.Path, d.Version)
	}
	return 0
}
