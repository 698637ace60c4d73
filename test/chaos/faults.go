package chaos

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/raftps/raftps/shard/api"
	"github.com/raftps/raftps/shard/client"
	"github.com/raftps/raftps/test/history"
)

// group is one shard of a workload table.
type group struct {
	table string
	shard uint32
}

func (g group) String() string { return fmt.Sprintf("%s/%d", g.table, g.shard) }

// leaders returns each workload shard's leader ID as the cluster reports it.
func (r *run) leaders(ctx context.Context) map[group]string {
	out := map[group]string{}
	for _, name := range r.cc.Tables {
		d, err := r.admin.Tables().Describe(ctx, name)
		if err != nil {
			continue
		}
		for _, sh := range d.Shards {
			if sh.LeaderID != "" {
				out[group{name, uint32(sh.Shard)}] = sh.LeaderID
			}
		}
	}
	return out
}

// nodeIDs returns the IDs of the cluster's nodes that are not removed.
func (r *run) nodeIDs(ctx context.Context) ([]string, error) {
	cm, err := r.admin.Admin().ClusterMap(ctx)
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, n := range cm.Nodes {
		if n.Admin != client.NodeRemoved {
			ids = append(ids, n.ID)
		}
	}
	sort.Strings(ids)
	return ids, nil
}

// inject carries out one fault: picks its victim, does it, probes writes to
// the shards the victim led until they succeed, heals it after cc.down (but
// kill-node), and waits for the shards' replicas to catch up.
func (r *run) inject(ctx context.Context, kind string, rng *rand.Rand) Fault {
	f := Fault{Kind: kind, AtS: time.Since(r.start).Seconds(), UnavailableMs: -1, ReplicatedMs: -1, IdleUnavailableMs: -1}
	leaders := r.leaders(ctx)
	ids, err := r.nodeIDs(ctx)
	if err != nil || len(leaders) == 0 {
		f.Error = fmt.Sprintf("cannot see the cluster to choose a victim: %v", err)
		r.logf("%s: %s", kind, f.Error)
		return f
	}
	var live []string
	for _, id := range ids {
		if !r.killed[id] {
			live = append(live, id)
		}
	}
	var victims []string
	switch kind {
	case "kill-leader", "pause-leader", "partition-leader":
		groups := make([]group, 0, len(leaders))
		for g := range leaders {
			groups = append(groups, g)
		}
		slices.SortFunc(groups, func(a, b group) int { return strings.Compare(a.String(), b.String()) })
		victims = []string{leaders[groups[rng.IntN(len(groups))]]}
	case "partition-minority", "partition-majority":
		// A minority: (N-1)/2 nodes; a majority: N/2+1, so that no group
		// has a quorum until the heal. Each victim is cut off alone.
		n := max(1, (len(live)-1)/2)
		if kind == "partition-majority" {
			n = len(live)/2 + 1
		}
		perm := rng.Perm(len(live))
		for _, i := range perm[:n] {
			victims = append(victims, live[i])
		}
	case "slow-node":
		victims = []string{live[rng.IntN(len(live))]}
	case "kill-node":
		maxReplicas := 0
		for _, s := range r.specs {
			maxReplicas = max(maxReplicas, s.Replicas)
		}
		if len(live) <= maxReplicas {
			f.Error = fmt.Sprintf("kill-node needs more live nodes (%d) than replicas per shard (%d): the cluster could not repair", len(live), maxReplicas)
			r.logf("%s: %s", kind, f.Error)
			return f
		}
		victims = []string{live[rng.IntN(len(live))]}
	}
	f.Node = strings.Join(victims, ",")
	var affected []group
	for g, l := range leaders {
		// With a majority cut off, no group has a quorum: every one is hit.
		if slices.Contains(victims, l) || kind == "partition-majority" {
			affected = append(affected, g)
		}
	}
	slices.SortFunc(affected, func(a, b group) int { return strings.Compare(a.String(), b.String()) })
	f.Groups = groupNames(affected)

	var do, undo func(string) error
	switch kind {
	case "kill-leader", "kill-node":
		do, undo = r.target.kill, r.target.start
	case "pause-leader":
		do, undo = r.target.pause, r.target.resume
	case "partition-leader", "partition-minority", "partition-majority":
		do, undo = r.target.isolate, r.target.reconnect
	case "slow-node":
		do = func(id string) error { return r.target.slow(id, r.cc.SlowBy) }
		undo = func(id string) error { return r.target.slow(id, 0) }
	}
	t0 := time.Now()
	for _, v := range victims {
		if err := do(v); err != nil {
			f.Error = err.Error()
			r.logf("%s %s: %v", kind, v, err)
			for _, u := range victims {
				_ = undo(u)
			}
			return f
		}
	}
	r.logf("%s: %s (leading %s)", kind, f.Node, strings.Join(f.Groups, " "))
	// The probes run across the heal: with a majority cut off, writes
	// come back only after it. The idle tables' groups are probed apart:
	// they were quiet when the fault hit, and their window is reported on
	// its own.
	type probed struct {
		d  time.Duration
		ok bool
	}
	var busy, idle []group
	for _, g := range affected {
		if IsIdle(g.table) {
			idle = append(idle, g)
		} else {
			busy = append(busy, g)
		}
	}
	startProbe := func(groups []group) <-chan probed {
		ch := make(chan probed, 1)
		go func() {
			d, ok := r.probe(groups, t0.Add(r.cc.Every-r.cc.Down/2))
			ch <- probed{d, ok}
		}()
		return ch
	}
	probe, idleProbe := startProbe(busy), startProbe(idle)
	if kind != "kill-node" {
		time.Sleep(time.Until(t0.Add(r.cc.Down)))
		for _, v := range victims {
			if err := undo(v); err != nil {
				f.Error = fmt.Sprintf("healing %s: %v", v, err)
			}
		}
	}
	if p := <-probe; p.ok {
		f.UnavailableMs = p.d.Milliseconds()
	}
	idleNote := ""
	if p := <-idleProbe; len(idle) > 0 {
		if p.ok {
			f.IdleUnavailableMs = p.d.Milliseconds()
			idleNote = fmt.Sprintf(" (idle tables: %d ms)", f.IdleUnavailableMs)
		} else if f.Error == "" {
			f.Error = fmt.Sprintf("an idle table's shard (of %s) took no write before the next fault", strings.Join(groupNames(idle), " "))
		}
	}
	if kind == "kill-node" {
		r.killed[victims[0]] = true
		r.logf("  writes back after %d ms%s; %s stays down", f.UnavailableMs, idleNote, victims[0])
		return f
	}
	if d, ok := r.caughtUp(ctx, affected, t0.Add(r.cc.Every-r.cc.Down/4)); ok {
		f.ReplicatedMs = d.Sub(t0).Milliseconds()
	}
	r.logf("  writes back after %d ms%s, replicas caught up after %d ms", f.UnavailableMs, idleNote, f.ReplicatedMs)
	return f
}

func groupNames(gs []group) []string {
	names := make([]string, len(gs))
	for i, g := range gs {
		names[i] = g.String()
	}
	return names
}

// probe pushes to each affected group until one push each is
// acknowledged, or until deadline; it returns the time from the fault to
// the last group's first acknowledged push. Probes are pushes like any
// other: recorded in the table's history, and checked with it.
func (r *run) probe(groups []group, deadline time.Time) (time.Duration, bool) {
	if len(groups) == 0 {
		return 0, true
	}
	start := time.Now()
	cl := r.prober
	var mu sync.Mutex
	var last time.Duration
	ok := true
	var wg sync.WaitGroup
	for _, g := range groups {
		wg.Go(func() {
			spec := r.specs[g.table]
			key := r.probeKey(g)
			vec := make([]float32, spec.Dim)
			for i := range vec {
				vec[i] = 1
			}
			for time.Now().Before(deadline) {
				p := r.recs[g.table].InvokeLevel(-1, history.Push, spec.Consistency.String(), []uint64{key}, []int64{1})
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				err := cl.Push(ctx, g.table, []uint64{key}, vec)
				cancel()
				if err == nil {
					p.OK(nil)
					mu.Lock()
					last = max(last, time.Since(start))
					mu.Unlock()
					return
				}
				p.Fail(false, err)
				time.Sleep(20 * time.Millisecond)
			}
			mu.Lock()
			ok = false
			mu.Unlock()
		})
	}
	wg.Wait()
	return last, ok
}

// probeKey returns a key of the run's range (or just above it) in g's shard.
func (r *run) probeKey(g group) uint64 {
	shards := uint32(r.specs[g.table].Shards)
	for k := r.base; ; k++ {
		if api.ShardOf(k, shards) == g.shard {
			return k
		}
	}
}

// caughtUp waits until every replica of groups has applied what its leader
// had applied when the wait began, and returns when that happened.
func (r *run) caughtUp(ctx context.Context, groups []group, deadline time.Time) (time.Time, bool) {
	if len(groups) == 0 {
		return time.Now(), true
	}
	want := map[string]uint64{}
	for time.Now().Before(deadline) {
		st := r.statuses(ctx, false)
		done := true
		for _, g := range groups {
			id := g.String()
			var applied []uint64
			for _, s := range st {
				for _, rs := range s.Replicas {
					if rs.Group == id {
						if rs.State == "leader" && want[id] == 0 {
							want[id] = rs.Applied
						}
						applied = append(applied, rs.Applied)
					}
				}
			}
			replicas := r.specs[g.table].Replicas
			if want[id] == 0 || len(applied) < replicas || slices.Min(applied) < want[id] {
				done = false
			}
		}
		if done {
			return time.Now(), true
		}
		time.Sleep(50 * time.Millisecond)
	}
	return time.Time{}, false
}

// statuses asks every reachable node for its status.
func (r *run) statuses(ctx context.Context, checksums bool) []client.NodeStatus {
	addrs, _ := r.target.addrs()
	out := make([]client.NodeStatus, len(addrs))
	var wg sync.WaitGroup
	for i, a := range addrs {
		wg.Go(func() {
			c, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			if st, err := r.admin.Admin().NodeStatus(c, a, checksums); err == nil {
				out[i] = st
			}
		})
	}
	wg.Wait()
	return slices.DeleteFunc(out, func(s client.NodeStatus) bool { return s.NodeID == "" })
}

// healAll undoes every fault still in effect (but kill-node's): starts
// stopped nodes, resumes paused ones, reconnects cut-off ones. Each undo is
// harmless when there is nothing to undo.
func (r *run) healAll() {
	ids, err := r.nodeIDs(context.Background())
	if err != nil {
		r.logf("heal: cannot list nodes: %v", err)
		return
	}
	for _, id := range ids {
		if r.killed[id] {
			continue
		}
		_ = r.target.resume(id)
		_ = r.target.reconnect(id)
		_ = r.target.start(id) // already running: refused, nothing done
	}
}

// converge waits until, for every shard of the workload tables, all its
// live replicas have applied the same index with equal checksums; it
// reports whether the checksums agree.
func (r *run) converge(ctx context.Context, timeout time.Duration) (bool, error) {
	deadline := time.Now().Add(timeout)
	var last string
	for time.Now().Before(deadline) {
		st := r.statuses(ctx, true)
		type replica struct {
			applied, sum uint64
			has          bool
		}
		byGroup := map[string][]replica{}
		for _, s := range st {
			for _, rs := range s.Replicas {
				if _, ok := r.specs[rs.Table]; ok && rs.Group != "meta" {
					var sum uint64
					if rs.Checksum != nil {
						sum = *rs.Checksum
					}
					byGroup[rs.Group] = append(byGroup[rs.Group], replica{rs.Applied, sum, rs.Checksum != nil})
				}
			}
		}
		settled, equal := true, true
		last = ""
		for _, name := range r.cc.Tables {
			spec := r.specs[name]
			live := spec.Replicas
			if n := len(st); n < live {
				live = n
			}
			for s := range spec.Shards {
				g := fmt.Sprintf("%s/%d", name, s)
				rs := byGroup[g]
				if len(rs) < live {
					settled, last = false, fmt.Sprintf("%s: %d of %d replicas answer", g, len(rs), live)
					continue
				}
				for _, x := range rs {
					if !x.has || x.applied != rs[0].applied {
						settled, last = false, fmt.Sprintf("%s: replicas at different indexes", g)
					} else if x.sum != rs[0].sum {
						equal = false
					}
				}
			}
		}
		if settled {
			return equal, nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return false, fmt.Errorf("not within %s (%s)", timeout, last)
}

// check reads the final rows of every key in a table's history and runs
// the checkers its level calls for.
func (r *run) check(ctx context.Context, name string, faults []Fault) (TableResult, []string) {
	spec := r.specs[name]
	rec := r.recs[name]
	ops := rec.Ops()
	tr := TableResult{Name: name, Level: spec.Consistency.String(), Idle: IsIdle(name), History: filepath.Join(r.cc.OutDir, name+".jsonl")}
	// Fault-free: called neither while a fault lasted nor in the second
	// after its heal.
	tr.ReadP99Ms = pullP99(ops, func(call int64) bool {
		for _, f := range faults {
			at := r.start.Add(time.Duration(f.AtS * float64(time.Second)))
			if call >= rec.At(at) && call < rec.At(at.Add(r.cc.Down+time.Second)) {
				return false
			}
		}
		return true
	})
	tr.MaxPushMs, tr.MaxPullMs = maxLatency(ops, history.Push), maxLatency(ops, history.Pull)
	var violations []string
	bad := func(format string, args ...any) {
		violations = append(violations, fmt.Sprintf("%s: ", name)+fmt.Sprintf(format, args...))
	}
	if err := history.WriteFile(tr.History, ops); err != nil {
		bad("writing the history: %v", err)
	}
	keySet := map[uint64]bool{}
	for _, op := range ops {
		for _, k := range op.Keys {
			keySet[k] = true
		}
		if op.Outcome == history.OK && op.Kind == history.Pull {
			tr.Pulls++
		}
	}
	keys := make([]uint64, 0, len(keySet))
	for k := range keySet {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	dim := spec.Dim
	out := make([]float32, len(keys)*dim)
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := r.admin.Pull(rctx, name, keys, out, client.WithConsistency(client.Linearizable)); err != nil {
		bad("reading the final rows: %v", err)
		return tr, violations
	}
	final := map[uint64]int64{}
	for i, k := range keys {
		final[k] = int64(out[i*dim])
		for j := 1; j < dim; j++ {
			if out[i*dim+j] != out[i*dim] {
				bad("key %d: row %v is not uniform: a push was applied in part", k, out[i*dim:(i+1)*dim])
				break
			}
		}
	}
	fr := history.CheckFinal(ops, final)
	tr.Acked, tr.Lost, tr.Doubled, tr.Unknown = fr.AckedPushes, fr.Lost, fr.Doubled, fr.UnknownPushes
	tr.UnknownApplied, tr.UnknownNotApplied = fr.Applied, fr.NotApplied
	for _, op := range ops {
		if op.Kind == history.Push && op.Outcome == history.Unknown {
			tr.UnknownUndecided += len(op.Keys)
		}
	}
	tr.UnknownUndecided -= fr.Resolved
	for _, v := range fr.Violations {
		bad("%s", v)
	}
	switch spec.Consistency.Level {
	case client.Linearizable:
		res, err := history.CheckLinearizable(ops, 2*time.Minute, filepath.Join(r.cc.OutDir, name+".html"))
		switch {
		case err != nil:
			bad("linearizability check: %v", err)
		case res.TimedOut:
			bad("linearizability check timed out (no verdict)")
		default:
			v := res.OK
			tr.Linearizable = &v
			if !v {
				bad("NOT linearizable: %v (see %s)", res, filepath.Join(r.cc.OutDir, name+".html"))
			}
		}
	case client.Bounded:
		bound := spec.Consistency.Bound
		vs, err := history.CheckBounded(ops, bound, time.Duration(float64(bound)*api.ClockRateAllowance))
		if err != nil {
			bad("staleness check: %v", err)
			break
		}
		v := len(vs) == 0
		tr.Staleness = &v
		for i, x := range vs {
			if i == 5 {
				bad("... %d staleness violations in all", len(vs))
				break
			}
			bad("stale pull: %v", x)
		}
	}
	return tr, violations
}

// PrintReport prints a report for people.
func PrintReport(w io.Writer, rep *Report) {
	fmt.Fprintf(w, "\n==> chaos on %s, %.0fs\n", rep.Target, rep.DurationS)
	var tables []string // with readers: the idle ones have none
	for _, t := range rep.Tables {
		if !t.Idle {
			tables = append(tables, t.Name)
		}
	}
	fmt.Fprintf(w, "%-20s %-10s %16s %16s  %-28s %s\n", "FAULT", "NODE", "UNAVAILABLE(ms)", "REPLICATED(ms)", "SHARDS LED", "READ WINDOW/P99 (ms) "+strings.Join(tables, " "))
	for _, f := range rep.Faults {
		var reads []string
		for _, t := range tables {
			reads = append(reads, fmt.Sprintf("%d/%d", f.ReadWindowMs[t], f.ReadP99Ms[t]))
		}
		fmt.Fprintf(w, "%-20s %-10s %16d %16d  %-28s %s", f.Kind, f.Node, f.UnavailableMs, f.ReplicatedMs, strings.Join(f.Groups, " "), strings.Join(reads, " "))
		if f.IdleUnavailableMs >= 0 {
			fmt.Fprintf(w, "  idle tables %d ms", f.IdleUnavailableMs)
		}
		if f.Error != "" {
			fmt.Fprintf(w, "  ERROR: %s", f.Error)
		}
		fmt.Fprintln(w)
	}
	if len(rep.Faults) > 3 {
		fmt.Fprintf(w, "%-20s %6s %7s %10s %10s %10s %16s %14s  %s\n", "KIND", "COUNT", "FAILED", "P50(ms)", "P99(ms)", "MAX(ms)", "REPLICATED P50", "IDLE MAX(ms)", "READ WINDOW MAX (ms)")
		for _, k := range rep.ByKind {
			var reads []string
			for _, t := range tables {
				reads = append(reads, fmt.Sprint(k.ReadWindowMaxMs[t]))
			}
			fmt.Fprintf(w, "%-20s %6d %7d %10d %10d %10d %16d %14d  %s\n", k.Kind, k.Count, k.Failed, k.P50Ms, k.P99Ms, k.MaxMs, k.RepP50Ms, k.IdleMaxMs, strings.Join(reads, " "))
		}
	}
	verdict := func(v *bool) string {
		switch {
		case v == nil:
			return "not checked"
		case *v:
			return "ok"
		}
		return "VIOLATED"
	}
	for _, t := range rep.Tables {
		fmt.Fprintf(w, "table %s (%s): %d acknowledged pushes, %d pulls (p99 %d ms without faults; slowest push %d ms, pull %d ms), %d lost, %d applied twice, %d unknown (per key: %d applied, %d not, %d undecided); linearizable: %s; staleness: %s; history %s\n",
			t.Name, t.Level, t.Acked, t.Pulls, t.ReadP99Ms, t.MaxPushMs, t.MaxPullMs, t.Lost, t.Doubled, t.Unknown, t.UnknownApplied, t.UnknownNotApplied, t.UnknownUndecided,
			verdict(t.Linearizable), verdict(t.Staleness), t.History)
	}
	fmt.Fprintf(w, "replica checksums equal: %v\n", rep.ChecksumsEqual)
	if len(rep.Violations) == 0 {
		fmt.Fprintln(w, "verdict: PASS (nothing lost or doubled, every checked history valid)")
		return
	}
	fmt.Fprintf(w, "verdict: FAIL, %d violations:\n", len(rep.Violations))
	for _, v := range rep.Violations {
		fmt.Fprintf(w, "  - %s\n", v)
	}
}
