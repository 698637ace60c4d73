package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/pprof"

	"github.com/raftps/raftps/shard/client"
	"github.com/raftps/raftps/test/bench"
)

func runBench(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("raftps bench", flag.ContinueOnError)
	var cf clusterFlags
	cf.register(fs)
	bc := bench.DefaultConfig()
	fs.StringVar(&bc.Workload, "workload", bc.Workload, "pull, push or mixed (half each)")
	fs.IntVar(&bc.Keys, "keys", bc.Keys, "distinct keys in the table")
	fs.IntVar(&bc.Dim, "dim", bc.Dim, "row length (when bench creates the table)")
	fs.IntVar(&bc.Batch, "batch", bc.Batch, "distinct keys per pull or push")
	fs.Float64Var(&bc.Zipf, "zipf", bc.Zipf, "Zipf exponent of key popularity (> 1)")
	fs.IntVar(&bc.Clients, "clients", bc.Clients, "concurrent clients")
	fs.DurationVar(&bc.Duration, "duration", bc.Duration, "how long to run")
	fs.StringVar(&bc.Table, "table", "", "use this existing table instead of creating one")
	fs.IntVar(&bc.Shards, "shards", bc.Shards, "shards (when bench creates the table)")
	fs.StringVar(&bc.Optimizer, "optimizer", bc.Optimizer, "optimizer (when bench creates the table)")
	fs.StringVar(&bc.Replication, "replication", bc.Replication, "raft or chain (when bench creates the table)")
	fs.BoolVar(&bc.Load, "load", bc.Load, "push every key once before measuring")
	hedge := fs.Bool("hedge", true, "hedge reads that other replicas may serve (--hedge=false measures what hedging costs)")
	cpuProfile := fs.String("cpuprofile", "", "write the bench client's CPU profile to this file")
	if rc := parse(fs, args, stderr); rc >= 0 {
		return rc
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return fail(stderr, "bench", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fail(stderr, "bench", err)
		}
		defer pprof.StopCPUProfile()
	}
	if len(cf.addrs()) == 0 {
		return fail(stderr, "bench", fmt.Errorf("no cluster given: pass --cluster or set RAFTPS_CLUSTER"))
	}
	creds, err := cf.tls.dialOptions()
	if err != nil {
		return fail(stderr, "bench", err)
	}
	bc.Client = func(c *client.Config) {
		c.DialOptions = append(c.DialOptions, creds...)
		if !*hedge {
			c.HedgeAfter = -1
		}
	}
	res, err := bench.Run(context.Background(), cf.addrs(), bc, stderr)
	if err != nil {
		return fail(stderr, "bench", err)
	}
	if cf.json {
		_ = printJSON(stdout, res)
		return 0
	}
	fmt.Fprintf(stdout, "%s on %s: %.0f rows/s (push %.0f, pull %.0f), batch latency p50 %.1f ms p99 %.1f ms max %.1f ms, %d errors, %d hedges, %d clients × %d keys, %.1fs\n",
		res.Workload, res.Table, res.RowsPerS, res.PushRowsPerS, res.PullRowsPerS, res.P50ms, res.P99ms, res.MaxMs, res.Errors, res.Hedges, res.Clients, res.Batch, res.Seconds)
	return 0
}
