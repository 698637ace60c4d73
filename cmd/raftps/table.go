package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/raftps/raftps/shard/api"
	"github.com/raftps/raftps/shard/client"
)

func runTable(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, "usage: raftps table create|alter|drop|list|describe ...")
		return 2
	}
	switch args[0] {
	case "create":
		return tableCreate(args[1:], stdout, stderr)
	case "list":
		return tableList(args[1:], stdout, stderr)
	case "describe":
		return tableDescribe(args[1:], stdout, stderr)
	case "alter":
		return tableAlter(args[1:], stdout, stderr)
	case "drop":
		return tableDrop(args[1:], stdout, stderr)
	}
	fmt.Fprintf(stderr, "raftps table: unknown subcommand %q (want create, alter, drop, list or describe)\n", args[0])
	return 2
}

// parseConsistency reads --consistency: linearizable, eventual or bounded:DURATION.
func parseConsistency(s string) (c client.Consistency, err error) {
	if c, err = client.ParseConsistency(s); err != nil {
		err = fmt.Errorf("--consistency: %w", err)
	}
	return c, err
}

// Help texts of the hot-key flags, shared by table create and table alter.
const (
	hotThresholdHelp = "pulls a second of one key (over all replicas of its shard) from which it is hot and read replicas outside the shard serve it too; 0 turns hot-key detection off"
	hotReplicasHelp  = "read replicas of each shard's hot keys (0: the server's default, 2; at most 16)"
)

// hotSetting is a table's hot-key setting as describe and list print it.
func hotSetting(s client.TableSpec) string {
	if s.HotThreshold <= 0 {
		return "off"
	}
	unit := "read replicas"
	if s.HotReplicas == 1 {
		unit = "read replica"
	}
	return fmt.Sprintf(">= %s pulls/s, %d %s", strconv.FormatFloat(s.HotThreshold, 'g', -1, 64), s.HotReplicas, unit)
}

// gradName is a table's gradient precision; a table created before the
// setting existed has none, which is fp32.
func gradName(s client.TableSpec) string {
	if s.GradPrecision == "" {
		return api.GradFP32
	}
	return string(s.GradPrecision)
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
	cons := fs.String("consistency", "linearizable", "linearizable, bounded:DURATION (10ms..1h) or eventual")
	hotThreshold := fs.Float64("hot-threshold", 0, hotThresholdHelp)
	hotReplicas := fs.Uint("hot-replicas", 0, hotReplicasHelp)
	grads := fs.String("grad-precision", api.GradFP32, "what pushes' gradients travel and are logged as: fp32, or bf16 (bfloat16: half the bytes, each gradient rounded to 8 mantissa bits; rows stay float32); fixed at creation")
	repl := fs.String("replication", api.ReplicationRaft, "how each shard is replicated: raft (a Raft group per shard) or chain (head → … → tail, CRAQ reads); fixed at creation")
	// The name comes first; flags after it.
	name, rest, rc := nameArg(fs, args, "raftps table create NAME --dim N [flags]", stderr)
	if rc >= 0 {
		return rc
	}
	if rc := parse(fs, rest, stderr); rc >= 0 {
		return rc
	}
	c, err := parseConsistency(*cons)
	if err != nil {
		return fail(stderr, "table create", err)
	}
	if *dim <= 0 {
		return fail(stderr, "table create", fmt.Errorf("--dim is required (1..4096)"))
	}
	if *repl != api.ReplicationRaft && *repl != api.ReplicationChain {
		return fail(stderr, "table create", fmt.Errorf("--replication %q: want %s or %s", *repl, api.ReplicationRaft, api.ReplicationChain))
	}
	if *grads != api.GradFP32 && *grads != api.GradBF16 {
		return fail(stderr, "table create", fmt.Errorf("--grad-precision %q: want %s or %s", *grads, api.GradFP32, api.GradBF16))
	}
	cl, err := cf.client()
	if err != nil {
		return fail(stderr, "table create", err)
	}
	defer cl.Close()
	spec, err := cl.Tables().Create(context.Background(), client.TableSpec{
		Name: name, Dim: *dim, Optimizer: *opt, Initializer: *init, Shards: int(*shards),
		Replicas: int(*replicas), Seed: *seed, Consistency: c,
		HotThreshold: *hotThreshold, HotReplicas: int(*hotReplicas), Replication: client.Replication(*repl),
		GradPrecision: client.GradPrecision(*grads),
	})
	if err != nil {
		return fail(stderr, "table create", err)
	}
	if cf.json {
		_ = printJSON(stdout, spec)
		return 0
	}
	fmt.Fprintf(stdout, "created table %s: dim %d, %d shards × %d replicas (%s), %s, init %s, %s, hot keys: %s, %s gradients\n",
		spec.Name, spec.Dim, spec.Shards, spec.Replicas, spec.Replication, spec.Optimizer, spec.Initializer, spec.Consistency, hotSetting(spec), gradName(spec))
	return 0
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
	specs, err := cl.Tables().List(context.Background())
	if err != nil {
		return fail(stderr, "table list", err)
	}
	if cf.json {
		if specs == nil {
			specs = []client.TableSpec{}
		}
		_ = printJSON(stdout, specs)
		return 0
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tDIM\tSHARDS\tREPLICAS\tREPLICATION\tOPTIMIZER\tINIT\tCONSISTENCY\tHOT KEYS")
	for _, s := range specs {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t%s\n", s.Name, s.Dim, s.Shards, s.Replicas, s.Replication, s.Optimizer, s.Initializer, s.Consistency, hotSetting(s))
	}
	tw.Flush()
	return 0
}

func tableDescribe(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("raftps table describe NAME", flag.ContinueOnError)
	var cf clusterFlags
	cf.register(fs)
	name, rest, rc := nameArg(fs, args, "raftps table describe NAME [flags]", stderr)
	if rc >= 0 {
		return rc
	}
	if rc := parse(fs, rest, stderr); rc >= 0 {
		return rc
	}
	cl, err := cf.client()
	if err != nil {
		return fail(stderr, "table describe", err)
	}
	defer cl.Close()
	d, err := cl.Tables().Describe(context.Background(), name)
	if err != nil {
		return fail(stderr, "table describe", err)
	}
	printDescribe(stdout, d, cf.json)
	return 0
}

// printDescribe prints a table as describe does; alter prints the altered
// table the same way, so scripts read both alike. Its JSON is the client's
// TableInfo: the spec, and each shard's replicas (a chain's order, head
// first), epoch and leader.
func printDescribe(stdout io.Writer, d client.TableInfo, asJSON bool) {
	s := d.Spec
	chain := s.Replication == client.Chain
	if asJSON {
		_ = printJSON(stdout, d)
		return
	}
	fmt.Fprintf(stdout, "table %s: dim %d, %d shards × %d replicas (%s), %s, init %s, seed %d, %s\n",
		s.Name, s.Dim, s.Shards, s.Replicas, s.Replication, s.Optimizer, s.Initializer, s.Seed, s.Consistency)
	fmt.Fprintf(stdout, "hot keys: %s\n", hotSetting(s))
	fmt.Fprintf(stdout, "gradients: %s\n", gradName(s))
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	if chain {
		// A chain's head is the first of its order in the map.
		fmt.Fprintln(tw, "SHARD\tEPOCH\tCHAIN (head → tail)")
		for _, sh := range d.Shards {
			fmt.Fprintf(tw, "%d\t%d\t%s\n", sh.Shard, sh.Epoch, strings.Join(sh.Replicas, " → "))
		}
		tw.Flush()
		return
	}
	fmt.Fprintln(tw, "SHARD\tLEADER\tADDR")
	for _, sh := range d.Shards {
		id := sh.LeaderID
		if id == "" {
			id = "(none)"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\n", sh.Shard, id, sh.LeaderAddr)
	}
	tw.Flush()
}

// alterOptions are the changes of the alter flags the command line gave
// (fs parsed): a flag left out keeps the table's setting, and one given as
// 0 is a change (--hot-threshold 0 turns hot keys off).
func alterOptions(fs *flag.FlagSet, cons string, threshold float64, replicas uint) ([]client.AlterOption, error) {
	var opts []client.AlterOption
	var err error
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "consistency":
			var c client.Consistency
			if c, err = parseConsistency(cons); err == nil {
				opts = append(opts, client.SetConsistency(c))
			}
		case "hot-threshold":
			opts = append(opts, client.SetHotThreshold(threshold))
		case "hot-replicas":
			opts = append(opts, client.SetHotReplicas(int(replicas)))
		}
	})
	if err == nil && len(opts) == 0 {
		err = errors.New("nothing to change: give --consistency, --hot-threshold and/or --hot-replicas")
	}
	return opts, err
}

func tableAlter(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("raftps table alter NAME", flag.ContinueOnError)
	var cf clusterFlags
	cf.register(fs)
	cons := fs.String("consistency", "", "new level: linearizable, bounded:DURATION (10ms..1h) or eventual")
	threshold := fs.Float64("hot-threshold", 0, hotThresholdHelp+" (default: the table's)")
	replicas := fs.Uint("hot-replicas", 0, "read replicas of each shard's hot keys (default: the table's; at most 16)")
	name, rest, rc := nameArg(fs, args, "raftps table alter NAME [--consistency C] [--hot-threshold RATE] [--hot-replicas N] [flags]", stderr)
	if rc >= 0 {
		return rc
	}
	if rc := parse(fs, rest, stderr); rc >= 0 {
		return rc
	}
	opts, err := alterOptions(fs, *cons, *threshold, *replicas)
	if err != nil {
		return fail(stderr, "table alter", err)
	}
	cl, err := cf.client()
	if err != nil {
		return fail(stderr, "table alter", err)
	}
	defer cl.Close()
	ctx := context.Background()
	spec, err := cl.Tables().Alter(ctx, name, opts...)
	if err != nil {
		return fail(stderr, "table alter", err)
	}
	// The spec is Alter's: a node that has not applied the change yet
	// would describe the old one. Describe only adds the shards' leaders,
	// so the output reads like describe's.
	d, err := cl.Tables().Describe(ctx, name)
	if err != nil {
		fmt.Fprintf(stderr, "raftps table alter: altered; listing the shard leaders failed: %v\n", err)
	}
	d.Spec = spec
	printDescribe(stdout, d, cf.json)
	return 0
}

func tableDrop(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("raftps table drop NAME", flag.ContinueOnError)
	var cf clusterFlags
	cf.register(fs)
	force := fs.Bool("force", false, "drop the table even while a trainer job in the registry uses it")
	name, rest, rc := nameArg(fs, args, "raftps table drop NAME [--force] [flags]", stderr)
	if rc >= 0 {
		return rc
	}
	if rc := parse(fs, rest, stderr); rc >= 0 {
		return rc
	}
	cl, err := cf.client()
	if err != nil {
		return fail(stderr, "table drop", err)
	}
	defer cl.Close()
	if err := cl.Tables().Drop(context.Background(), name, *force); err != nil {
		if errors.Is(err, client.ErrTableInUse) {
			err = fmt.Errorf("%w (--force drops it anyway)", err)
		}
		return fail(stderr, "table drop", err)
	}
	fmt.Fprintf(stdout, "table %s dropped\n", name)
	return 0
}

func runPull(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("raftps pull TABLE KEY...", flag.ContinueOnError)
	var cf clusterFlags
	cf.register(fs)
	cons := fs.String("consistency", "", "linearizable, bounded:DURATION or eventual (default: the table's level and bound)")
	weaker := fs.Bool("allow-weaker", false, "allow a weaker level than the table's (refused without it), or a looser bound (the table's is used without it)")
	table, rest, rc := nameArg(fs, args, "raftps pull TABLE KEY... [flags]", stderr)
	if rc >= 0 {
		return rc
	}
	var keys []uint64
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
	if len(keys) == 0 {
		return fail(stderr, "pull", fmt.Errorf("no keys: usage: raftps pull TABLE KEY... [flags]"))
	}
	opts, err := pullOptions(*cons, *weaker)
	if err != nil {
		return fail(stderr, "pull", err)
	}
	cl, err := cf.client()
	if err != nil {
		return fail(stderr, "pull", err)
	}
	defer cl.Close()
	d, err := cl.Tables().Describe(context.Background(), table)
	if err != nil {
		return fail(stderr, "pull", err)
	}
	dim := d.Spec.Dim
	out := make([]float32, len(keys)*dim)
	if err := cl.Pull(context.Background(), table, keys, out, opts...); err != nil {
		if errors.Is(err, client.ErrWeakerConsistency) && !*weaker {
			err = fmt.Errorf("%w; pass --allow-weaker to read it anyway", err)
		}
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

// pullOptions are the options of a pull with --consistency cons ("": the
// table's) and --allow-weaker.
func pullOptions(cons string, allowWeaker bool) ([]client.PullOption, error) {
	var opts []client.PullOption
	if allowWeaker {
		opts = append(opts, client.AllowWeaker())
	}
	if cons != "" {
		c, err := parseConsistency(cons)
		if err != nil {
			return nil, err
		}
		opts = append(opts, client.AtConsistency(c))
	}
	return opts, nil
}
