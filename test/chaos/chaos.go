package chaos

import (
	"context"
	"encoding/json"
	"errors"
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

	"github.com/raftps/raftps/shard/client"
	"github.com/raftps/raftps/test/history"
	"google.golang.org/grpc"
)

// raftps chaos: a workload of pushes and pulls whose every acknowledged push
// can be accounted for (SGD with lr=1, small positive integer gradients on a
// zero table), faults injected into the cluster while it runs, then heal,
// convergence and the verdicts: nothing lost or doubled, the linearizable
// tables' histories linearizable, the bounded tables' pulls within their
// bound, every shard's replicas equal.

var FaultKinds = []string{"kill-leader", "pause-leader", "partition-leader", "slow-node", "partition-minority", "partition-majority", "kill-node"}

// singleNode are the faults that take one node away: a table whose reads
// any replica may serve (bounded, eventual) must keep answering them. A
// slow node is not among them: while it leads a shard, no replica can show
// a bounded table's state is within the bound (that needs a round trip to
// the leader shorter than the bound), so its read windows are reported,
// not held to MaxReadGap.
var singleNode = []string{"kill-leader", "pause-leader", "partition-leader", "kill-node"}

// Defaults of a Config.
const (
	// SlowBy is how late a slow node answers.
	DefaultSlowBy = 200 * time.Millisecond
	// MaxReadGap is how long a single-node fault may leave a bounded or
	// eventual table without a completed pull.
	DefaultMaxReadGap = time.Second
)

// Config configures a chaos run.
type Config struct {
	// Duration of the workload; one fault every Every, in turn from
	// Faults (of FaultKinds); a killed, paused or cut-off node stays so for
	// Down, which must be shorter than Every.
	Duration, Every, Down time.Duration
	Faults                []string
	// Tables to run the workload on, Clients each (pushes and pulls) and
	// Readers each (pulls only, so that read availability is measured
	// apart from writes), on Keys keys; created if missing (TableSpec).
	Tables  []string
	Clients int
	Readers int
	Keys    int
	// SlowBy is how late a slow-node fault makes its node answer (0:
	// DefaultSlowBy); MaxReadGap how long a single-node fault may leave a
	// bounded or eventual table without a completed pull (0:
	// DefaultMaxReadGap).
	SlowBy, MaxReadGap time.Duration
	// OutDir receives the histories, the report and, on a failed
	// linearizability check, porcupine's HTML; empty: a new temporary
	// directory.
	OutDir string
	// Seed of the fault and workload choices (0: random).
	Seed uint64
}

// Validate reports what is wrong with the config, naming the fields.
func (c Config) Validate() error {
	for _, f := range c.Faults {
		if !slices.Contains(FaultKinds, f) {
			return fmt.Errorf("chaos config: unknown fault %q (want %s)", f, strings.Join(FaultKinds, ", "))
		}
	}
	switch {
	case len(c.Faults) == 0 || len(c.Tables) == 0:
		return errors.New("chaos config: Faults and Tables need at least one entry each")
	case c.Duration <= 0 || c.Every <= 0 || c.Down <= 0 || c.Clients < 1 || c.Keys < 1:
		return errors.New("chaos config: Duration, Every, Down, Clients and Keys must be positive")
	case c.Readers < 0 || c.SlowBy < 0 || c.MaxReadGap < 0:
		return errors.New("chaos config: Readers, SlowBy and MaxReadGap must not be negative")
	case c.Down >= c.Every:
		return fmt.Errorf("chaos config: Down (%s) must be shorter than Every (%s): one fault is healed before the next", c.Down, c.Every)
	}
	return nil
}

// Fault is what chaos did and measured for one fault.
type Fault struct {
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
	ReplicatedMs int64 `json:"replicated_ms"`
	// IdleUnavailableMs: the same for the idle tables' groups among
	// Groups (IsIdle): groups quiet when the fault hit them
	// (-1: none of Groups is an idle table's).
	IdleUnavailableMs int64 `json:"idle_unavailable_ms"`
	// ReadWindowMs: by table, the longest stretch of the fault's slot (from
	// the fault to the next) in which no pull of the table completed: how
	// long its readers went unanswered. ReadP99Ms: by table, the 99th
	// percentile latency of the pulls made while the fault lasted.
	ReadWindowMs map[string]int64 `json:"read_window_ms"`
	ReadP99Ms    map[string]int64 `json:"read_p99_ms"`
	Error        string           `json:"error,omitempty"`
}

type TableResult struct {
	Name  string `json:"name"`
	Level string `json:"level"`
	// Idle: no workload, only the probes after faults (IsIdle).
	Idle    bool `json:"idle,omitempty"`
	Acked   int  `json:"acked"`
	Pulls   int  `json:"pulls"`
	Lost    int  `json:"lost"`
	Doubled int  `json:"doubled"`
	Unknown int  `json:"unknown"`
	// How the unknown-outcome pushes resolved, per (push, key): provably
	// applied, provably not, or not determinable from the final rows.
	UnknownApplied    int `json:"unknown_applied"`
	UnknownNotApplied int `json:"unknown_not_applied"`
	UnknownUndecided  int `json:"unknown_undecided"`
	// ReadP99Ms: the 99th percentile latency of the table's pulls made
	// while no fault was in effect, to set the faults' read_p99_ms beside.
	ReadP99Ms int64 `json:"read_p99_ms"`
	// MaxPushMs, MaxPullMs: the longest completed push and pull of the
	// workload's clients, faults or not. The windows above say when a
	// table served again; these say how long one call caught in a fault
	// waited (-1 if none).
	MaxPushMs    int64  `json:"max_push_ms"`
	MaxPullMs    int64  `json:"max_pull_ms"`
	Linearizable *bool  `json:"linearizable"`
	Staleness    *bool  `json:"staleness_ok"`
	History      string `json:"history"`
}

type Report struct {
	Target    string  `json:"target"`
	DurationS float64 `json:"duration_s"`
	Faults    []Fault `json:"faults"`
	// ByKind summarises the faults of each kind.
	ByKind         []KindSummary `json:"by_kind"`
	Tables         []TableResult `json:"tables"`
	Acked          int           `json:"acked"`
	Lost           int           `json:"lost"`
	Doubled        int           `json:"doubled"`
	Unknown        int           `json:"unknown"`
	Linearizable   *bool         `json:"linearizable"`
	Staleness      *bool         `json:"staleness_ok"`
	ChecksumsEqual bool          `json:"checksums_equal"`
	Violations     []string      `json:"violations"`
}

// KindSummary: the unavailability windows of one kind of fault, over
// the faults whose writes came back (the others count in Failed).
type KindSummary struct {
	Kind     string `json:"kind"`
	Count    int    `json:"count"`
	Failed   int    `json:"failed"`
	P50Ms    int64  `json:"unavailable_p50_ms"`
	P99Ms    int64  `json:"unavailable_p99_ms"`
	MaxMs    int64  `json:"unavailable_max_ms"`
	RepP50Ms int64  `json:"replicated_p50_ms"`
	// ReadWindowMaxMs: by table, the longest read window of the kind's
	// faults.
	ReadWindowMaxMs map[string]int64 `json:"read_window_max_ms"`
	// IdleMaxMs: the longest IdleUnavailableMs of the kind's faults (-1:
	// none hit an idle table).
	IdleMaxMs int64 `json:"idle_unavailable_max_ms"`
}

func summarizeFaults(faults []Fault) []KindSummary {
	var out []KindSummary
	for _, kind := range FaultKinds {
		s := KindSummary{Kind: kind, IdleMaxMs: -1}
		var un, rep []int64
		for _, f := range faults {
			if f.Kind != kind {
				continue
			}
			s.Count++
			for t, w := range f.ReadWindowMs {
				if s.ReadWindowMaxMs == nil {
					s.ReadWindowMaxMs = map[string]int64{}
				}
				s.ReadWindowMaxMs[t] = max(s.ReadWindowMaxMs[t], w)
			}
			if f.UnavailableMs < 0 || f.Error != "" {
				s.Failed++
				continue
			}
			s.IdleMaxMs = max(s.IdleMaxMs, f.IdleUnavailableMs)
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

// IsIdle says whether the table named name is an idle one: created like
// the others, but without workload clients, so that only the probes after
// faults write to it and its groups are quiet (raftps server
// --quiesce-after) when a fault hits their leader.
func IsIdle(name string) bool { return strings.Contains(name, "idl") }

// TableSpec is the spec chaos creates a missing table with: a name
// containing "bnd" makes it bounded:100ms, "evt" eventual, any other
// linearizable; "chn" a chain table; "hot" gives it hot keys.
func TableSpec(name string) client.TableSpec {
	spec := client.TableSpec{Name: name, Dim: 2, Shards: 4, Optimizer: "sgd:lr=1", Initializer: "zeros"}
	switch {
	case strings.Contains(name, "bnd"):
		spec.Consistency = client.Consistency{Level: client.Bounded, Bound: 100 * time.Millisecond}
	case strings.Contains(name, "evt"):
		spec.Consistency = client.Consistency{Level: client.Eventual}
	}
	if strings.Contains(name, "chn") {
		spec.Replication = client.Chain
	}
	if strings.Contains(name, "hot") {
		// Low enough that the workload's keys turn hot, so that read
		// replicas (on clusters with nodes outside the replica sets) serve
		// pulls whose staleness the checker then judges.
		spec.HotThreshold, spec.HotReplicas = 5, 2
	}
	return spec
}

// run is one run's shared state.
type run struct {
	cc       Config
	target   Target
	progress io.Writer
	admin    *client.Client
	start    time.Time
	specs    map[string]client.TableSpec
	base     uint64 // the run's keys are base..base+keys-1: earlier runs' rows do not count
	recs     map[string]*history.Recorder
	// killed: nodes killed for good (kill-node), never healed.
	killed map[string]bool
	// prober pushes the probes: one client for the whole run, so it knows
	// the leaders before a fault as a trainer's client would.
	prober *client.Client
}

func (r *run) logf(format string, args ...any) {
	fmt.Fprintf(r.progress, "[%6.1fs] %s\n", time.Since(r.start).Seconds(), fmt.Sprintf(format, args...))
}

// Run runs the workload on target's cluster while it injects the faults,
// then heals, waits for the replicas to converge and checks every table's
// history. It writes the histories and the report (report.json) to
// cc.OutDir; progress hears what it does as it goes. The report's
// Violations say what failed; the error is for a run that could not be
// made at all.
func Run(cc Config, target Target, progress io.Writer) (*Report, error) {
	if err := cc.Validate(); err != nil {
		return nil, err
	}
	if lt, ok := target.(*localTarget); ok && !lt.canPartition() && slices.ContainsFunc(cc.Faults, func(f string) bool { return strings.HasPrefix(f, "partition-") || f == "slow-node" }) {
		return nil, errNoPartition
	}
	if cc.Seed == 0 {
		cc.Seed = rand.Uint64()
	}
	var err error
	if cc.OutDir == "" {
		if cc.OutDir, err = os.MkdirTemp("", "raftps-chaos-"); err != nil {
			return nil, err
		}
	} else if err := os.MkdirAll(cc.OutDir, 0o755); err != nil {
		return nil, err
	}
	if progress == nil {
		progress = io.Discard
	}
	if cc.SlowBy == 0 {
		cc.SlowBy = DefaultSlowBy
	}
	if cc.MaxReadGap == 0 {
		cc.MaxReadGap = DefaultMaxReadGap
	}
	rep, err := run1(cc, target, progress)
	if err != nil {
		return nil, err
	}
	b, err := json.MarshalIndent(rep, "", "  ")
	if err == nil {
		err = os.WriteFile(filepath.Join(cc.OutDir, "report.json"), append(b, '\n'), 0o644)
	}
	if err != nil {
		return rep, fmt.Errorf("writing the report: %w", err)
	}
	return rep, nil
}

func run1(cc Config, target Target, progress io.Writer) (*Report, error) {
	addrs, err := target.addrs()
	if err != nil {
		return nil, err
	}
	creds, err := target.dialOptions()
	if err != nil {
		return nil, err
	}
	newClient := func(addrs []string, attempt, retry time.Duration) (*client.Client, error) {
		return newClientCreds(addrs, creds, attempt, retry)
	}
	admin, err := newClient(addrs, 2*time.Second, 0)
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	r := &run{cc: cc, target: target, progress: progress, admin: admin, start: time.Now(),
		specs: map[string]client.TableSpec{}, recs: map[string]*history.Recorder{}, killed: map[string]bool{}}
	rng := rand.New(rand.NewPCG(cc.Seed, 0xc4a05))
	r.base = (rng.Uint64() >> 24) << 20
	ctx := context.Background()
	if r.prober, err = newClient(addrs, 300*time.Millisecond, time.Second); err != nil {
		return nil, err
	}
	defer r.prober.Close()
	for _, name := range cc.Tables {
		spec, err := r.table(ctx, name)
		if err != nil {
			return nil, err
		}
		r.specs[name] = spec
		r.recs[name] = history.NewRecorder()
		if _, err := r.prober.Tables().Describe(ctx, name); err != nil {
			return nil, err
		}
	}
	r.logf("chaos on %s for %s: faults %s every %s, tables %s, %d clients each, keys %d..%d, seed %d",
		target.name(), cc.Duration, strings.Join(cc.Faults, ","), cc.Every, strings.Join(cc.Tables, ","), cc.Clients, r.base, r.base+uint64(cc.Keys)-1, cc.Seed)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, name := range cc.Tables {
		if IsIdle(name) {
			continue
		}
		for w := range cc.Clients + cc.Readers {
			cl, err := newClient(addrs, time.Second, 0)
			if err != nil {
				return nil, err
			}
			defer cl.Close()
			wl := history.Workload{Table: name, Level: r.specs[name].Consistency.String(), Dim: r.specs[name].Dim, Keys: r.keys(),
				Client: w, Seed: rng.Uint64(), Definite: definitePushFailure, PullOnly: w >= cc.Clients}
			wg.Go(func() { wl.Run(cl, r.recs[name], stop) })
		}
	}

	var faults []Fault
	deadline := r.start.Add(cc.Duration)
	for i := 0; ; i++ {
		next := r.start.Add(time.Duration(i)*cc.Every + cc.Every/2)
		if next.Add(cc.Down).After(deadline) {
			break
		}
		time.Sleep(time.Until(next))
		f := r.inject(ctx, cc.Faults[i%len(cc.Faults)], rng)
		faults = append(faults, f)
	}
	time.Sleep(time.Until(deadline))
	close(stop)
	wg.Wait()
	r.logf("workload stopped; healing")
	r.healAll()

	rep := &Report{Target: target.name(), DurationS: cc.Duration.Seconds(), Faults: faults}
	rep.Violations = append(rep.Violations, r.readWindows(faults)...)
	rep.ByKind = summarizeFaults(faults)
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
	for _, name := range cc.Tables {
		tr, v := r.check(ctx, name, faults)
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

// readWindows measures every fault's read windows and pull p99 per table
// from the histories, and returns the single-node faults that left a
// bounded or eventual table unanswered for longer than MaxReadGap.
func (r *run) readWindows(faults []Fault) []string {
	var violations []string
	for i := range faults {
		f := &faults[i]
		at := r.start.Add(time.Duration(f.AtS * float64(time.Second)))
		f.ReadWindowMs, f.ReadP99Ms = map[string]int64{}, map[string]int64{}
		for _, name := range r.cc.Tables {
			if IsIdle(name) {
				continue // no readers
			}
			rec := r.recs[name]
			ops := rec.Ops()
			// The slot ends at the next fault or the workload's end.
			end := at.Add(r.cc.Every)
			if stop := r.start.Add(r.cc.Duration); end.After(stop) {
				end = stop
			}
			gap := history.ReadGap(ops, rec.At(at), rec.At(end))
			f.ReadWindowMs[name] = gap.Milliseconds()
			f.ReadP99Ms[name] = pullP99(ops, func(call int64) bool { return call >= rec.At(at) && call < rec.At(at.Add(r.cc.Down)) })
			level := r.specs[name].Consistency.Level
			if slices.Contains(singleNode, f.Kind) && level != client.Linearizable && gap > r.cc.MaxReadGap {
				violations = append(violations, fmt.Sprintf("fault %s on %s: table %s (%s) had no completed pull for %d ms (at most %d ms allowed)",
					f.Kind, f.Node, name, r.specs[name].Consistency, gap.Milliseconds(), r.cc.MaxReadGap.Milliseconds()))
			}
		}
	}
	return violations
}

// pullP99 is the 99th percentile latency, in ms, of the completed pulls
// whose call time in accepts (-1 if none).
func pullP99(ops []history.Op, in func(call int64) bool) int64 {
	var lat []int64
	for _, op := range ops {
		if op.Kind == history.Pull && op.Outcome == history.OK && in(op.Call) {
			lat = append(lat, (op.Return-op.Call)/int64(time.Millisecond))
		}
	}
	return quantile(lat, 0.99)
}

// maxLatency is the longest completed operation of kind, in ms, among the
// workload clients' (the probes, client -1, are timed by the windows) (-1
// if none).
func maxLatency(ops []history.Op, kind history.Kind) int64 {
	m := int64(-1)
	for _, op := range ops {
		if op.Kind == kind && op.Outcome == history.OK && op.Client >= 0 {
			m = max(m, (op.Return-op.Call)/int64(time.Millisecond))
		}
	}
	return m
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
func (r *run) table(ctx context.Context, name string) (client.TableSpec, error) {
	d, err := r.admin.Tables().Describe(ctx, name)
	if errors.Is(err, client.ErrUnknownTable) {
		spec, err := r.admin.Tables().Create(ctx, TableSpec(name))
		if err != nil {
			return client.TableSpec{}, err
		}
		return spec, nil
	}
	if err != nil {
		return client.TableSpec{}, fmt.Errorf("table %q: %w", name, err)
	}
	if s := d.Spec; s.Optimizer != "sgd:lr=1" || s.Initializer != "zeros" {
		return client.TableSpec{}, fmt.Errorf("table %q has optimizer %s and initializer %s: chaos needs sgd:lr=1 and zeros so that rows are exact sums (let chaos create its own tables)", name, s.Optimizer, s.Initializer)
	}
	return d.Spec, nil
}

// newClientCreds is a client of the cluster at addrs with its credentials
// and the attempt timeout (and retry timeout, if not 0) chaos's callers
// each want.
func newClientCreds(addrs []string, creds []grpc.DialOption, attempt, retry time.Duration) (*client.Client, error) {
	cfg := client.DefaultConfig(addrs...)
	cfg.DialOptions = creds
	cfg.AttemptTimeout = attempt
	if retry > 0 {
		cfg.RetryTimeout = retry
	}
	return client.New(cfg)
}

// keys returns the run's keys.
func (r *run) keys() []uint64 {
	out := make([]uint64, r.cc.Keys)
	for i := range out {
		out[i] = r.base + uint64(i)
	}
	return out
}

// definitePushFailure: a push refused as malformed was surely not
// applied; anything else may have been.
func definitePushFailure(err error) bool {
	return errors.Is(err, client.ErrDimMismatch) || errors.Is(err, client.ErrBadRequest)
}
