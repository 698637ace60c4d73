package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/raftps/raftps/shard"
	"github.com/raftps/raftps/shard/shardpb"
)

func runTable(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, "usage: raftps table create|alter|list|describe ...")
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
	}
	fmt.Fprintf(stderr, "raftps table: unknown subcommand %q (want create, alter, list or describe)\n", args[0])
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

// Help texts of the hot-key flags, shared by table create and table alter.
const (
	hotThresholdHelp = "pulls a second of one key (over all replicas of its shard) from which it is hot and read replicas outside the shard serve it too; 0 turns hot-key detection off"
	hotReplicasHelp  = "read replicas of each shard's hot keys (0: the server's default, 2; at most 16)"
)

// checkHot refuses hot-key settings the server would refuse, or silently
// drop (read replicas without a threshold), before anything is sent.
func checkHot(threshold float64, replicas uint) error {
	if math.IsNaN(threshold) || math.IsInf(threshold, 0) || threshold < 0 {
		return fmt.Errorf("--hot-threshold %v: want pulls a second >= 0 (0 turns hot keys off)", threshold)
	}
	if replicas > shard.MaxHotReplicas {
		return fmt.Errorf("--hot-replicas %d: want 0..%d", replicas, shard.MaxHotReplicas)
	}
	if threshold == 0 && replicas > 0 {
		return fmt.Errorf("--hot-replicas %d without a --hot-threshold: hot keys are off, so there would be no read replicas", replicas)
	}
	return nil
}

// hotSetting is a table's hot-key setting as describe and list print it.
func hotSetting(s *shardpb.TableSpec) string {
	if s.HotThreshold <= 0 {
		return "off"
	}
	unit := "read replicas"
	if s.HotReplicas == 1 {
		unit = "read replica"
	}
	return fmt.Sprintf(">= %s pulls/s, %d %s", strconv.FormatFloat(s.HotThreshold, 'g', -1, 64), s.HotReplicas, unit)
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
	repl := fs.String("replication", shard.ReplicationRaft, "how each shard is replicated: raft (a Raft group per shard) or chain (head → … → tail, CRAQ reads); fixed at creation")
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
	if err := checkHot(*hotThreshold, *hotReplicas); err != nil {
		return fail(stderr, "table create", err)
	}
	if *repl != shard.ReplicationRaft && *repl != shard.ReplicationChain {
		return fail(stderr, "table create", fmt.Errorf("--replication %q: want %s or %s", *repl, shard.ReplicationRaft, shard.ReplicationChain))
	}
	cl, err := cf.client()
	if err != nil {
		return fail(stderr, "table create", err)
	}
	defer cl.Close()
	spec, err := cl.CreateTable(context.Background(), &shardpb.TableSpec{
		Name: name, Dim: uint32(*dim), Optimizer: *opt, Initializer: *init, Shards: uint32(*shards),
		Replicas: uint32(*replicas), Seed: *seed, Consistency: c, StalenessBoundNs: int64(bound),
		HotThreshold: *hotThreshold, HotReplicas: uint32(*hotReplicas), Replication: *repl,
	})
	if err != nil {
		return fail(stderr, "table create", err)
	}
	if cf.json {
		_ = printJSON(stdout, specJSON(spec))
		return 0
	}
	fmt.Fprintf(stdout, "created table %s: dim %d, %d shards × %d replicas (%s), %s, init %s, %s, hot keys: %s\n",
		spec.Name, spec.Dim, spec.Shards, spec.Replicas, spec.Replication, spec.Optimizer, spec.Initializer, consistencyName(spec.Consistency, spec.StalenessBoundNs), hotSetting(spec))
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
	// HotThreshold 0: hot-key detection is off (and HotReplicas 0).
	HotThreshold float64 `json:"hot_threshold"`
	HotReplicas  uint32  `json:"hot_replicas"`
}

func specJSON(s *shardpb.TableSpec) tableJSON {
	return tableJSON{Name: s.Name, Dim: s.Dim, Shards: s.Shards, Replicas: s.Replicas, Optimizer: s.Optimizer, Initializer: s.Initializer,
		Seed: s.Seed, Consistency: consistencyName(s.Consistency, s.StalenessBoundNs), Replication: s.Replication,
		HotThreshold: s.HotThreshold, HotReplicas: s.HotReplicas}
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
	fmt.Fprintln(tw, "NAME\tDIM\tSHARDS\tREPLICAS\tREPLICATION\tOPTIMIZER\tINIT\tCONSISTENCY\tHOT KEYS")
	for _, s := range specs {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t%s\n", s.Name, s.Dim, s.Shards, s.Replicas, s.Replication, s.Optimizer, s.Initializer, consistencyName(s.Consistency, s.StalenessBoundNs), hotSetting(s))
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
	printDescribe(stdout, d, cf.json)
	return 0
}

// printDescribe prints a table as describe does; alter prints the altered
// table the same way, so scripts read both alike.
func printDescribe(stdout io.Writer, d *shardpb.DescribeTableResponse, asJSON bool) {
	if asJSON {
		type leader struct {
			Shard  uint32 `json:"shard"`
			Leader string `json:"leader"`
			Addr   string `json:"addr"`
		}
		// chain: a chain table's shards, each its order (head first) and
		// epoch; its "leader" is the head.
		type chain struct {
			Shard uint32   `json:"shard"`
			Epoch uint64   `json:"epoch"`
			Order []string `json:"order"`
		}
		out := struct {
			tableJSON
			Leaders []leader `json:"leaders"`
			Chains  []chain  `json:"chains,omitempty"`
		}{tableJSON: specJSON(d.Spec)}
		for _, l := range d.Leaders {
			out.Leaders = append(out.Leaders, leader{l.Shard, l.LeaderId, l.LeaderAddr})
		}
		if d.Spec.Replication == shard.ReplicationChain {
			for _, sm := range d.Shards {
				out.Chains = append(out.Chains, chain{sm.Shard, sm.Epoch, sm.Replicas})
			}
		}
		_ = printJSON(stdout, out)
		return
	}
	s := d.Spec
	fmt.Fprintf(stdout, "table %s: dim %d, %d shards × %d replicas (%s), %s, init %s, seed %d, %s\n",
		s.Name, s.Dim, s.Shards, s.Replicas, s.Replication, s.Optimizer, s.Initializer, s.Seed, consistencyName(s.Consistency, s.StalenessBoundNs))
	fmt.Fprintf(stdout, "hot keys: %s\n", hotSetting(s))
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	if s.Replication == shard.ReplicationChain {
		// A chain's head is the first of its order in the map.
		fmt.Fprintln(tw, "SHARD\tEPOCH\tCHAIN (head → tail)")
		for _, sm := range d.Shards {
			fmt.Fprintf(tw, "%d\t%d\t%s\n", sm.Shard, sm.Epoch, strings.Join(sm.Replicas, " → "))
		}
		tw.Flush()
		return
	}
	fmt.Fprintln(tw, "SHARD\tLEADER\tADDR")
	for _, l := range d.Leaders {
		id := l.LeaderId
		if id == "" {
			id = "(none)"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\n", l.Shard, id, l.LeaderAddr)
	}
	tw.Flush()
}

// alterFlags are the flags table alter was given; nil: not given. Whether a
// flag was given matters, not just its value: --hot-threshold 0 turns hot
// keys off, and a hot flag left out keeps the table's setting.
type alterFlags struct {
	consistency  *string
	hotThreshold *float64
	hotReplicas  *uint
}

// register defines the flags on fs. Their defaults are placeholders: only
// the flags given change the table (see given).
func (a *alterFlags) register(fs *flag.FlagSet) {
	a.consistency = fs.String("consistency", "", "new level: linearizable, bounded:DURATION (10ms..1h) or eventual")
	a.hotThreshold = fs.Float64("hot-threshold", 0, hotThresholdHelp+" (default: the table's)")
	a.hotReplicas = fs.Uint("hot-replicas", 0, "read replicas of each shard's hot keys (default: the table's; at most 16)")
}

// given drops the flags the parsed command line did not set.
func (a *alterFlags) given(fs *flag.FlagSet) {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if !set["consistency"] {
		a.consistency = nil
	}
	if !set["hot-threshold"] {
		a.hotThreshold = nil
	}
	if !set["hot-replicas"] {
		a.hotReplicas = nil
	}
}

// check validates the flags before any call to the cluster.
func (a alterFlags) check() error {
	if a.consistency == nil && a.hotThreshold == nil && a.hotReplicas == nil {
		return errors.New("nothing to change: give --consistency, --hot-threshold and/or --hot-replicas")
	}
	if a.consistency != nil {
		if _, _, err := parseConsistency(*a.consistency); err != nil {
			return err
		}
	}
	// A flag left out is checked against the table's spec in request.
	if a.hotThreshold != nil && a.hotReplicas != nil {
		return checkHot(*a.hotThreshold, *a.hotReplicas)
	}
	if a.hotThreshold != nil {
		return checkHot(*a.hotThreshold, 0)
	}
	if a.hotReplicas != nil && *a.hotReplicas > shard.MaxHotReplicas {
		return fmt.Errorf("--hot-replicas %d: want 0..%d", *a.hotReplicas, shard.MaxHotReplicas)
	}
	return nil
}

// needsSpec says whether request needs the table's current spec: the
// server sets both hot-key settings at once, so one given alone is paired
// with the table's other one.
func (a alterFlags) needsSpec() bool {
	return (a.hotThreshold == nil) != (a.hotReplicas == nil)
}

// request is the AlterTable request for table name; cur is its spec (only
// read if needsSpec).
func (a alterFlags) request(name string, cur *shardpb.TableSpec) (*shardpb.AlterTableRequest, error) {
	if err := a.check(); err != nil {
		return nil, err
	}
	if a.needsSpec() && cur == nil {
		return nil, fmt.Errorf("table %q: its current spec is needed to change one hot-key setting alone", name)
	}
	req := &shardpb.AlterTableRequest{Name: name}
	if a.consistency != nil {
		c, bound, _ := parseConsistency(*a.consistency)
		req.Consistency, req.StalenessBoundNs = c, int64(bound)
	}
	switch {
	case a.hotThreshold != nil && a.hotReplicas != nil:
		req.HotThreshold, req.HotReplicas = *a.hotThreshold, uint32(*a.hotReplicas)
	case a.hotThreshold != nil:
		req.HotThreshold = *a.hotThreshold
		// Turning hot keys off drops the read replicas; otherwise the
		// table's count stays (0 if they were off: the server's default).
		if req.HotThreshold > 0 {
			req.HotReplicas = cur.HotReplicas
		}
	case a.hotReplicas != nil:
		if cur.HotThreshold <= 0 {
			return nil, fmt.Errorf("table %q has hot keys off: give --hot-threshold with --hot-replicas", name)
		}
		req.HotThreshold, req.HotReplicas = cur.HotThreshold, uint32(*a.hotReplicas)
	}
	req.SetHot = a.hotThreshold != nil || a.hotReplicas != nil
	return req, nil
}

func tableAlter(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("raftps table alter NAME", flag.ContinueOnError)
	var cf clusterFlags
	cf.register(fs)
	var a alterFlags
	a.register(fs)
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		fmt.Fprintln(stderr, "usage: raftps table alter NAME [--consistency C] [--hot-threshold RATE] [--hot-replicas N] [flags]")
		fs.SetOutput(stderr)
		fs.PrintDefaults()
		return 2
	}
	name := args[0]
	if rc := parse(fs, args[1:], stderr); rc >= 0 {
		return rc
	}
	a.given(fs)
	if err := a.check(); err != nil {
		return fail(stderr, "table alter", err)
	}
	cl, err := cf.client()
	if err != nil {
		return fail(stderr, "table alter", err)
	}
	defer cl.Close()
	ctx := context.Background()
	var cur *shardpb.TableSpec
	if a.needsSpec() {
		d, err := cl.Describe(ctx, name)
		if err != nil {
			return fail(stderr, "table alter", err)
		}
		cur = d.Spec
	}
	req, err := a.request(name, cur)
	if err != nil {
		return fail(stderr, "table alter", err)
	}
	spec, err := cl.AlterTable(ctx, req)
	if err != nil {
		return fail(stderr, "table alter", err)
	}
	// The spec is AlterTable's: a node that has not applied the change yet
	// would describe the old one. Describe only adds the shard leaders, so
	// the output reads like describe's.
	d := &shardpb.DescribeTableResponse{Spec: spec}
	if got, err := cl.Describe(ctx, name); err != nil {
		fmt.Fprintf(stderr, "raftps table alter: altered; listing the shard leaders failed: %v\n", err)
	} else {
		d.Leaders = got.Leaders
	}
	printDescribe(stdout, d, cf.json)
	return 0
}

func runPull(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("raftps pull TABLE KEY...", flag.ContinueOnError)
	var cf clusterFlags
	cf.register(fs)
	cons := fs.String("consistency", "", "linearizable, bounded:DURATION or eventual (default: the table's level and bound)")
	weaker := fs.Bool("allow-weaker", false, "allow a weaker level than the table's (refused without it), or a looser bound (the table's is used without it)")
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
	opts, err := pullOptions(*cons, *weaker)
	if err != nil {
		return fail(stderr, "pull", err)
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
	if err := cl.PullOpts(context.Background(), table, keys, out, opts); err != nil {
		if errors.Is(err, shard.ErrWeakerConsistency) && !opts.AllowWeaker {
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
func pullOptions(cons string, allowWeaker bool) (shard.PullOptions, error) {
	o := shard.PullOptions{AllowWeaker: allowWeaker}
	if cons == "" {
		return o, nil
	}
	level, bound, err := parseConsistency(cons)
	if err != nil {
		return o, err
	}
	o.Level, o.StalenessBound = level, bound
	return o, nil
}
