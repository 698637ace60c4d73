package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/raftps/raftps/shard"
	"github.com/raftps/raftps/shard/shardpb"
	"github.com/raftps/raftps/store"
	"github.com/raftps/raftps/test/history"
)

// raftps chaos: a workload of pushes and pulls whose every acknowledged push
// can be accounted for (SGD with lr=1, small positive integer gradients on a
// zero table), faults injected into the cluster while it runs, then heal,
// convergence and the verdicts: nothing lost or doubled, the linearizable
// tables' histories linearizable, the bounded tables' pulls within their
// bound, every shard's replicas equal.

var chaosFaultKinds = []string{"kill-leader", "pause-leader", "partition-leader", "partition-minority", "partition-majority", "kill-node"}

type chaosConfig struct {
	target   string
	duration time.Duration
	every    time.Duration
	faults   []string
	tables   []string
	clients  int
	keys     int
	down     time.Duration // how long a killed, paused or isolated node stays so
	outDir   string
	seed     uint64
	json     bool
}

// chaosFault is what chaos did and measured for one fault.
type chaosFault struct {
	Kind string  `json:"kind"`
	Node string  `json:"node"`
	AtS  float64 `json:"at_s"`
	// Groups: the shard groups the node led (leader faults), whose writes
	// were probed.
	Groups []string `json:"groups,omitempty"`
	// UnavailableMs: from the fault until a push to every one of Groups was
	// acknowledged again (-1: not within the fault's slot).
	UnavailableMs int64 `json:"unavailable_ms"`
	// ReplicatedMs: from the fault until every replica of Groups had caught
	// up again after the node was healed (-1: not measured or not reached).
	ReplicatedMs int64  `json:"replicated_ms"`
	Error        string `json:"error,omitempty"`
}

type chaosTableResult struct {
	Name    string `json:"name"`
	Level   string `json:"level"`
	Acked   int    `json:"acked"`
	Pulls   int    `json:"pulls"`
	Lost    int    `json:"lost"`
	Doubled int    `json:"doubled"`
	Unknown int    `json:"unknown"`
	// How the unknown-outcome pushes resolved, per (push, key): provably
	// applied, provably not, or not determinable from the final rows.
	UnknownApplied    int    `json:"unknown_applied"`
	UnknownNotApplied int    `json:"unknown_not_applied"`
	UnknownUndecided  int    `json:"unknown_undecided"`
	Linearizable      *bool  `json:"linearizable"`
	Staleness         *bool  `json:"staleness_ok"`
	History           string `json:"history"`
}

type chaosReport struct {
	Target    string       `json:"target"`
	DurationS float64      `json:"duration_s"`
	Faults    []chaosFault `json:"faults"`
	// ByKind summarises the faults of each kind.
	ByKind         []chaosKindSummary `json:"by_kind"`
	Tables         []chaosTableResult `json:"tables"`
	Acked          int                `json:"acked"`
	Lost           int                `json:"lost"`
	Doubled        int                `json:"doubled"`
	Unknown        int                `json:"unknown"`
	Linearizable   *bool              `json:"linearizable"`
	Staleness      *bool              `json:"staleness_ok"`
	ChecksumsEqual bool               `json:"checksums_equal"`
	Violations     []string           `json:"violations"`
}

// chaosKindSummary: the unavailability windows of one kind of fault, over
// the faults whose writes came back (the others count in Failed).
type chaosKindSummary struct {
	Kind     string `json:"kind"`
	Count    int    `json:"count"`
	Failed   int    `json:"failed"`
	P50Ms    int64  `json:"unavailable_p50_ms"`
	P99Ms    int64  `json:"unavailable_p99_ms"`
	MaxMs    int64  `json:"unavailable_max_ms"`
	RepP50Ms int64  `json:"replicated_p50_ms"`
}

func summarizeFaults(faults []chaosFault) []chaosKindSummary {
	var out []chaosKindSummary
	for _, kind := range chaosFaultKinds {
		s := chaosKindSummary{Kind: kind}
		var un, rep []int64
		for _, f := range faults {
			if f.Kind != kind {
				continue
			}
			s.Count++
			if f.UnavailableMs < 0 || f.Error != "" {
				s.Failed++
				continue
			}
			un = append(un, f.UnavailableMs)
			if f.ReplicatedMs >= 0 {
				rep = append(rep, f.ReplicatedMs)
			}
		}
		if s.Count == 0 {
			continue
		}
		s.P50Ms, s.P99Ms, s.MaxMs = quantile(un, 0.5), quantile(un, 0.99), quantile(un, 1)
		s.RepP50Ms = quantile(rep, 0.5)
		out = append(out, s)
	}
	return out
}

// quantile is the q-quantile of xs by the nearest-rank method; -1 if empty.
func quantile(xs []int64, q float64) int64 {
	if len(xs) == 0 {
		return -1
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)]
}

func runChaos(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("raftps chaos", flag.ContinueOnError)
	var cc chaosConfig
	var faults, tables string
	fs.StringVar(&cc.target, "target", "", "the cluster: local:DIR (raftps cluster up --dir DIR) or docker:PROJECT (a compose project of deploy/docker-compose.yml)")
	fs.DurationVar(&cc.duration, "duration", 2*time.Minute, "how long the workload runs")
	fs.DurationVar(&cc.every, "every", 10*time.Second, "one fault this often, in turn from --faults")
	fs.StringVar(&faults, "faults", "kill-leader,pause-leader", "comma-separated: "+strings.Join(chaosFaultKinds, ", "))
	fs.StringVar(&tables, "tables", "chaos_lin,chaos_bnd", "tables to run the workload on; created if missing: a name containing \"bnd\" as bounded:100ms, \"evt\" as eventual, any other linearizable; one containing \"chn\" as a chain table, one containing \"hot\" with hot keys at 5 pulls/s and 2 read replicas (dim 2, SGD lr=1, zeros)")
	fs.IntVar(&cc.clients, "clients", 3, "workload clients per table")
	fs.IntVar(&cc.keys, "keys", 32, "keys per table the workload touches")
	fs.DurationVar(&cc.down, "down", 3*time.Second, "how long a killed, paused or cut-off node stays so before it is healed")
	fs.StringVar(&cc.outDir, "out", "", "directory for the histories (and porcupine's HTML on a failure); default: a new temporary directory")
	fs.Uint64Var(&cc.seed, "seed", 0, "seed of the fault and workload choices (0: random)")
	fs.BoolVar(&cc.json, "json", false, "print one summary object on stdout")
	if rc := parse(fs, args, stderr); rc >= 0 {
		return rc
	}
	for _, f := range strings.Split(faults, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		if !slices.Contains(chaosFaultKinds, f) {
			return fail(stderr, "chaos", fmt.Errorf("--faults: unknown fault %q (want %s)", f, strings.Join(chaosFaultKinds, ", ")))
		}
		cc.faults = append(cc.faults, f)
	}
	for _, t := range strings.Split(tables, ",") {
		if t = strings.TrimSpace(t); t != "" {
			cc.tables = append(cc.tables, t)
		}
	}
	switch {
	case cc.target == "":
		return fail(stderr, "chaos", errors.New("--target is required (local:DIR or docker:PROJECT)"))
	case len(cc.faults) == 0 || len(cc.tables) == 0:
		return fail(stderr, "chaos", errors.New("--faults and --tables need at least one entry each"))
	case cc.duration <= 0 || cc.every <= 0 || cc.down <= 0 || cc.clients < 1 || cc.keys < 1:
		return fail(stderr, "chaos", errors.New("--duration, --every, --down, --clients and --keys must be positive"))
	case cc.down >= cc.every:
		return fail(stderr, "chaos", fmt.Errorf("--down %s must be shorter than --every %s: one fault is healed before the next", cc.down, cc.every))
	}
	if cc.seed == 0 {
		cc.seed = rand.Uint64()
	}
	target, err := parseTarget(cc.target)
	if err != nil {
		return fail(stderr, "chaos", err)
	}
	if lt, ok := target.(*localTarget); ok && !lt.canPartition() && slices.ContainsFunc(cc.faults, func(f string) bool { return strings.HasPrefix(f, "partition-") }) {
		return fail(stderr, "chaos", errNoPartition)
	}
	if cc.outDir == "" {
		if cc.outDir, err = os.MkdirTemp("", "raftps-chaos-"); err != nil {
			return fail(stderr, "chaos", err)
		}
	} else if err := os.MkdirAll(cc.outDir, 0o755); err != nil {
		return fail(stderr, "chaos", err)
	}
	progress := stdout
	if cc.json {
		progress = stderr
	}
	rep, err := chaos(cc, target, progress)
	if err != nil {
		return fail(stderr, "chaos", err)
	}
	if f, err := os.Create(filepath.Join(cc.outDir, "report.json")); err == nil {
		_ = printJSON(f, rep)
		f.Close()
	}
	if cc.json {
		_ = printJSON(stdout, rep)
	} else {
		printChaosReport(stdout, rep)
	}
	if len(rep.Violations) > 0 {
		return 1
	}
	return 0
}

// chaosTableSpec is the spec chaos creates a missing table with.
func chaosTableSpec(name string) *shardpb.TableSpec {
	spec := &shardpb.TableSpec{Name: name, Dim: 2, Shards: 4, Optimizer: "sgd:lr=1", Initializer: "zeros"}
	switch {
	case strings.Contains(name, "bnd"):
		spec.Consistency, spec.StalenessBoundNs = shardpb.Consistency_CONSISTENCY_BOUNDED, int64(100*time.Millisecond)
	case strings.Contains(name, "evt"):
		spec.Consistency = shardpb.Consistency_CONSISTENCY_EVENTUAL
	}
	if strings.Contains(name, "chn") {
		spec.Replication = shard.ReplicationChain
	}
	if strings.Contains(name, "hot") {
		// Low enough that the workload's keys turn hot, so that read
		// replicas (on clusters with nodes outside the replica sets) serve
		// pulls whose staleness the checker then judges.
		spec.HotThreshold, spec.HotReplicas = 5, 2
	}
	return spec
}

// chaosRun is one run's shared state.
type chaosRun struct {
	cc       chaosConfig
	target   chaosTarget
	progress io.Writer
	admin    *shard.Client
	start    time.Time
	specs    map[string]*shardpb.TableSpec
	base     uint64 // the run's keys are base..base+keys-1: earlier runs' rows do not count
	recs     map[string]*history.Recorder
	// killed: nodes killed for good (kill-node), never healed.
	killed map[string]bool
	// prober pushes the probes: one client for the whole run, so it knows
	// the leaders before a fault as a trainer's client would.
	prober *shard.Client
}

func (r *chaosRun) logf(format string, args ...any) {
	fmt.Fprintf(r.progress, "[%6.1fs] %s\n", time.Since(r.start).Seconds(), fmt.Sprintf(format, args...))
}

func chaos(cc chaosConfig, target chaosTarget, progress io.Writer) (*chaosReport, error) {
	addrs, err := target.addrs()
	if err != nil {
		return nil, err
	}
	admin, err := shard.NewClient(shard.ClientConfig{Addrs: addrs, AttemptTimeout: 2 * time.Second})
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	r := &chaosRun{cc: cc, target: target, progress: progress, admin: admin, start: time.Now(),
		specs: map[string]*shardpb.TableSpec{}, recs: map[string]*history.Recorder{}, killed: map[string]bool{}}
	rng := rand.New(rand.NewPCG(cc.seed, 0xc4a05))
	r.base = (rng.Uint64() >> 24) << 20
	ctx := context.Background()
	if r.prober, err = shard.NewClient(shard.ClientConfig{Addrs: addrs, AttemptTimeout: 300 * time.Millisecond, RetryTimeout: time.Second}); err != nil {
		return nil, err
	}
	defer r.prober.Close()
	for _, name := range cc.tables {
		spec, err := r.table(ctx, name)
		if err != nil {
			return nil, err
		}
		r.specs[name] = spec
		r.recs[name] = history.NewRecorder()
		if _, err := r.prober.Describe(ctx, name); err != nil {
			return nil, err
		}
	}
	r.logf("chaos on %s for %s: faults %s every %s, tables %s, %d clients each, keys %d..%d, seed %d",
		target.name(), cc.duration, strings.Join(cc.faults, ","), cc.every, strings.Join(cc.tables, ","), cc.clients, r.base, r.base+uint64(cc.keys)-1, cc.seed)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, name := range cc.tables {
		for w := range cc.clients {
			cl, err := shard.NewClient(shard.ClientConfig{Addrs: addrs, AttemptTimeout: time.Second})
			if err != nil {
				return nil, err
			}
			defer cl.Close()
			wl := history.Workload{Table: name, Level: levelOf(r.specs[name]), Dim: int(r.specs[name].Dim), Keys: r.keys(),
				Client: w, Seed: rng.Uint64(), Definite: definitePushFailure}
			wg.Go(func() { wl.Run(cl, r.recs[name], stop) })
		}
	}

	var faults []chaosFault
	deadline := r.start.Add(cc.duration)
	for i := 0; ; i++ {
		next := r.start.Add(time.Duration(i)*cc.every + cc.every/2)
		if next.Add(cc.down).After(deadline) {
			break
		}
		time.Sleep(time.Until(next))
		f := r.inject(ctx, cc.faults[i%len(cc.faults)], rng)
		faults = append(faults, f)
	}
	time.Sleep(time.Until(deadline))
	close(stop)
	wg.Wait()
	r.logf("workload stopped; healing")
	r.healAll()

	rep := &chaosReport{Target: target.name(), DurationS: cc.duration.Seconds(), Faults: faults, ByKind: summarizeFaults(faults)}
	sumsEqual, err := r.converge(ctx, 90*time.Second)
	if err != nil {
		rep.Violations = append(rep.Violations, fmt.Sprintf("replicas did not converge: %v", err))
	}
	rep.ChecksumsEqual = sumsEqual && err == nil
	if err == nil && !sumsEqual {
		rep.Violations = append(rep.Violations, "replica checksums differ")
	}
	for _, f := range faults {
		if f.Error != "" {
			rep.Violations = append(rep.Violations, fmt.Sprintf("fault %s on %s: %s", f.Kind, f.Node, f.Error))
		}
	}
	for _, name := range cc.tables {
		tr, v := r.check(ctx, name)
		rep.Tables = append(rep.Tables, tr)
		rep.Violations = append(rep.Violations, v...)
		rep.Acked += tr.Acked
		rep.Lost += tr.Lost
		rep.Doubled += tr.Doubled
		rep.Unknown += tr.Unknown
		rep.Linearizable = andVerdict(rep.Linearizable, tr.Linearizable)
		rep.Staleness = andVerdict(rep.Staleness, tr.Staleness)
	}
	if rep.Violations == nil {
		rep.Violations = []string{}
	}
	return rep, nil
}

// andVerdict combines verdicts: null (not checked) unless some table was.
func andVerdict(a, b *bool) *bool {
	switch {
	case b == nil:
		return a
	case a == nil:
		v := *b
		return &v
	}
	v := *a && *b
	return &v
}

// table returns the spec of a workload table, creating it if missing. An
// existing table must be one the checks can account for.
func (r *chaosRun) table(ctx context.Context, name string) (*shardpb.TableSpec, error) {
	d, err := r.admin.Describe(ctx, name)
	if errors.Is(err, store.ErrUnknownTable) {
		spec, err := r.admin.CreateTable(ctx, chaosTableSpec(name))
		if err != nil {
			return nil, fmt.Errorf("creating table %q: %w", name, err)
		}
		return spec, nil
	}
	if err != nil {
		return nil, fmt.Errorf("table %q: %w", name, err)
	}
	if s := d.Spec; s.Optimizer != "sgd:lr=1" || s.Initializer != "zeros" {
		return nil, fmt.Errorf("table %q has optimizer %s and initializer %s: chaos needs sgd:lr=1 and zeros so that rows are exact sums (let chaos create its own tables)", name, s.Optimizer, s.Initializer)
	}
	return d.Spec, nil
}

func levelOf(s *shardpb.TableSpec) string { return consistencyName(s.Consistency, s.StalenessBoundNs) }

// keys returns the run's keys.
func (r *chaosRun) keys() []uint64 {
	out := make([]uint64, r.cc.keys)
	for i := range out {
		out[i] = r.base + uint64(i)
	}
	return out
}

// definitePushFailure: a push refused as malformed was surely not
// applied; anything else may have been.
func definitePushFailure(err error) bool {
	return errors.Is(err, store.ErrDimMismatch) || errors.Is(err, shard.ErrBadRequest)
}
