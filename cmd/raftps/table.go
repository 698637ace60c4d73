package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/raftps/raftps/shard/shardpb"
)

func runTable(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, "usage: raftps table create|list|describe ...")
		return 2
	}
	switch args[0] {
	case "create":
		return tableCreate(args[1:], stdout, stderr)
	case "list":
		return tableList(args[1:], stdout, stderr)
	case "describe":
		return tableDescribe(args[1:], stdout, stderr)
	}
	fmt.Fprintf(stderr, "raftps table: unknown subcommand %q (want create, list or describe)\n", args[0])
	return 2
}

// parseConsistency reads linearizable, eventual or bounded:DURATION.
func parseConsistency(s string) (shardpb.Consistency, time.Duration, error) {
	kind, arg, _ := strings.Cut(s, ":")
	switch kind {
	case "linearizable":
		return shardpb.Consistency_CONSISTENCY_LINEARIZABLE, 0, nil
	case "eventual":
		return shardpb.Consistency_CONSISTENCY_EVENTUAL, 0, nil
	case "bounded":
		d, err := time.ParseDuration(arg)
		if err != nil || d <= 0 {
			return 0, 0, fmt.Errorf("--consistency %q: want bounded:DURATION, e.g. bounded:100ms", s)
		}
		return shardpb.Consistency_CONSISTENCY_BOUNDED, d, nil
	}
	return 0, 0, fmt.Errorf("--consistency %q: want linearizable, bounded:DURATION or eventual", s)
}

func consistencyName(c shardpb.Consistency, bound int64) string {
	switch c {
	case shardpb.Consistency_CONSISTENCY_LINEARIZABLE:
		return "linearizable"
	case shardpb.Consistency_CONSISTENCY_EVENTUAL:
		return "eventual"
	case shardpb.Consistency_CONSISTENCY_BOUNDED:
		return "bounded:" + time.Duration(bound).String()
	}
	return c.String()
}

func tableCreate(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("raftps table create NAME", flag.ContinueOnError)
	var cf clusterFlags
	cf.register(fs)
	dim := fs.Int("dim", 0, "length of a row (required)")
	opt := fs.String("optimizer", "adagrad", "sgd, adagrad, adam, ftrl or assign (stores the pushed vector), with parameters as adagrad:lr=0.05,eps=1e-8")
	init := fs.String("init", "uniform:0.01", "initializer: zeros, uniform:A or normal:SIGMA")
	shards := fs.Uint("shards", 8, "number of shards")
	replicas := fs.Uint("replicas", 3, "replicas per shard")
	seed := fs.Uint64("seed", 0, "initializer seed")
	cons := fs.String("consistency", "linearizable", "linearizable, bounded:DURATION or eventual")
	// The name comes first; flags after it.
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		fmt.Fprintln(stderr, "usage: raftps table create NAME --dim N [flags]")
		fs.SetOutput(stderr)
		fs.PrintDefaults()
		return 2
	}
	name := args[0]
	if rc := parse(fs, args[1:], stderr); rc >= 0 {
		return rc
	}
	c, bound, err := parseConsistency(*cons)
	if err != nil {
		return fail(stderr, "table create", err)
	}
	if *dim <= 0 {
		return fail(stderr, "table create", fmt.Errorf("--dim is required (1..4096)"))
	}
	cl, err := cf.client()
	if err != nil {
		return fail(stderr, "table create", err)
	}
	defer cl.Close()
	spec, err := cl.CreateTable(context.Background(), &shardpb.TableSpec{
		Name: name, Dim: uint32(*dim), Optimizer: *opt, Initializer: *init, Shards: uint32(*shards),
		Replicas: uint32(*replicas), Seed: *seed, Consistency: c, StalenessBoundNs: int64(bound),
	})
	if err != nil {
		return fail(stderr, "table create", err)
	}
	if cf.json {
		_ = printJSON(stdout, specJSON(spec))
		return 0
	}
	fmt.Fprintf(stdout, "created table %s: dim %d, %d shards × %d replicas, %s, init %s, %s\n",
		spec.Name, spec.Dim, spec.Shards, spec.Replicas, spec.Optimizer, spec.Initializer, consistencyName(spec.Consistency, spec.StalenessBoundNs))
	return 0
}

type tableJSON struct {
	Name        string `json:"name"`
	Dim         uint32 `json:"dim"`
	Shards      uint32 `json:"shards"`
	Replicas    uint32 `json:"replicas"`
	Optimizer   string `json:"optimizer"`
	Initializer string `json:"initializer"`
	Seed        uint64 `json:"seed"`
	Consistency string `json:"consistency"`
	Replication string `json:"replication"`
}

func specJSON(s *shardpb.TableSpec) tableJSON {
	return tableJSON{s.Name, s.Dim, s.Shards, s.Replicas, s.Optimizer, s.Initializer, s.Seed, consistencyName(s.Consistency, s.StalenessBoundNs), s.Replication}
}

func tableList(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("raftps table list", flag.ContinueOnError)
	var cf clusterFlags
	cf.register(fs)
	if rc := parse(fs, args, stderr); rc >= 0 {
		return rc
	}
	cl, err := cf.client()
	if err != nil {
		return fail(stderr, "table list", err)
	}
	defer cl.Close()
	specs, err := cl.ListTables(context.Background())
	if err != nil {
		return fail(stderr, "table list", err)
	}
	if cf.json {
		out := []tableJSON{}
		for _, s := range specs {
			out = append(out, specJSON(s))
		}
		_ = printJSON(stdout, out)
		return 0
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tDIM\tSHARDS\tREPLICAS\tOPTIMIZER\tINIT\tCONSISTENCY")
	for _, s := range specs {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\t%s\t%s\n", s.Name, s.Dim, s.Shards, s.Replicas, s.Optimizer, s.Initializer, consistencyName(s.Consistency, s.StalenessBoundNs))
	}
	tw.Flush()
	return 0
}

func tableDescribe(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("raftps table describe NAME", flag.ContinueOnError)
	var cf clusterFlags
	cf.register(fs)
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		fmt.Fprintln(stderr, "usage: raftps table describe NAME [flags]")
		return 2
	}
	name := args[0]
	if rc := parse(fs, args[1:], stderr); rc >= 0 {
		return rc
	}
	cl, err := cf.client()
	if err != nil {
		return fail(stderr, "table describe", err)
	}
	defer cl.Close()
	d, err := cl.Describe(context.Background(), name)
	if err != nil {
		return fail(stderr, "table describe", err)
	}
	if cf.json {
		type leader struct {
			Shard  uint32 `json:"shard"`
			Leader string `json:"leader"`
			Addr   string `json:"addr"`
		}
		out := struct {
			tableJSON
			Leaders []leader `json:"leaders"`
		}{tableJSON: specJSON(d.Spec)}
		for _, l := range d.Leaders {
			out.Leaders = append(out.Leaders, leader{l.Shard, l.LeaderId, l.LeaderAddr})
		}
		_ = printJSON(stdout, out)
		return 0
	}
	s := d.Spec
	fmt.Fprintf(stdout, "table %s: dim %d, %d shards × %d replicas (%s), %s, init %s, seed %d, %s\n",
		s.Name, s.Dim, s.Shards, s.Replicas, s.Replication, s.Optimizer, s.Initializer, s.Seed, consistencyName(s.Consistency, s.StalenessBoundNs))
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SHARD\tLEADER\tADDR")
	for _, l := range d.Leaders {
		id := l.LeaderId
		if id == "" {
			id = "(none)"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\n", l.Shard, id, l.LeaderAddr)
	}
	tw.Flush()
	return 0
}

func runPull(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("raftps pull TABLE KEY...", flag.ContinueOnError)
	var cf clusterFlags
	cf.register(fs)
	cons := fs.String("consistency", "", "linearizable or eventual (default: the table's)")
	if len(args) < 2 || strings.HasPrefix(args[0], "-") {
		fmt.Fprintln(stderr, "usage: raftps pull TABLE KEY... [flags]")
		return 2
	}
	table := args[0]
	var keys []uint64
	rest := args[1:]
	for len(rest) > 0 && !strings.HasPrefix(rest[0], "-") {
		k, err := strconv.ParseUint(rest[0], 10, 64)
		if err != nil {
			return fail(stderr, "pull", fmt.Errorf("key %q is not an unsigned integer", rest[0]))
		}
		keys = append(keys, k)
		rest = rest[1:]
	}
	if rc := parse(fs, rest, stderr); rc >= 0 {
		return rc
	}
	level := shardpb.Consistency_CONSISTENCY_UNSPECIFIED
	if *cons != "" {
		var err error
		if level, _, err = parseConsistency(*cons); err != nil {
			return fail(stderr, "pull", err)
		}
	}
	cl, err := cf.client()
	if err != nil {
		return fail(stderr, "pull", err)
	}
	defer cl.Close()
	d, err := cl.Describe(context.Background(), table)
	if err != nil {
		return fail(stderr, "pull", err)
	}
	dim := int(d.Spec.Dim)
	out := make([]float32, len(keys)*dim)
	if err := cl.PullWith(context.Background(), table, keys, out, level); err != nil {
		return fail(stderr, "pull", err)
	}
	if cf.json {
		rows := map[string][]float32{}
		for i, k := range keys {
			rows[strconv.FormatUint(k, 10)] = out[i*dim : (i+1)*dim]
		}
		_ = printJSON(stdout, rows)
		return 0
	}
	for i, k := range keys {
		fmt.Fprintf(stdout, "%d:", k)
		for _, v := range out[i*dim : (i+1)*dim] {
			fmt.Fprintf(stdout, " %g", v)
		}
		fmt.Fprintln(stdout)
	}
	return 0
}
