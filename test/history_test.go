package test

import (
	"context"
	"errors"

	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/raftps/raftps/shard/api"
	"github.com/raftps/raftps/shard/client"
	"github.com/raftps/raftps/test/history"
)

// historyWorkload runs clients that push small integer gradients (SGD, lr=1,
// so rows are exact sums) and pull, on keys 0..keys-1 of table, recording
// every call in rec until stop closes.
func historyWorkload(c *Cluster, rec *history.Recorder, table, level string, clients, keys int, stop <-chan struct{}) *sync.WaitGroup {
	ks := make([]uint64, keys)
	for i := range ks {
		ks[i] = uint64(i)
	}
	var wg sync.WaitGroup
	for w := range clients {
		wl := history.Workload{Table: table, Level: level, Dim: 2, Keys: ks, Client: w, Seed: 7,
			Definite: func(err error) bool {
				return errors.Is(err, client.ErrDimMismatch) || errors.Is(err, client.ErrBadRequest)
			}}
		cl := c.Client()
		wg.Go(func() { wl.Run(cl, rec, stop) })
	}
	return &wg
}

// TestHistoryCheckedThroughLeaderKills records pushes and pulls of a
// linearizable and a bounded:100ms table from several clients while the
// leaders of their shards are killed and restarted, then checks: porcupine
// finds the linearizable table's history linearizable; every bounded pull
// reflects every push acknowledged more than the bound (plus the clock-rate
// allowance) before it began; no acknowledged push is lost or applied twice;
// the replicas agree.
func TestHistoryCheckedThroughLeaderKills(t *testing.T) {
	c := StartCluster(t, 3, FastRaft())
	cl := c.Client()
	ctx := context.Background()
	const bound = 100 * time.Millisecond
	tables := []struct{ name, level string }{{"hlin", "linearizable"}, {"hbnd", "bounded:100ms"}}
	for _, tb := range tables {
		spec := levelSpec(tb.name, client.Linearizable, 0)
		spec.Dim = 2
		if tb.name == "hbnd" {
			spec.Consistency = client.Consistency{Level: client.Bounded, Bound: bound}
		}
		if _, err := cl.Tables().Create(ctx, spec); err != nil {
			t.Fatal(err)
		}
	}
	recs := map[string]*history.Recorder{}
	stop := make(chan struct{})
	var wgs []*sync.WaitGroup
	for _, tb := range tables {
		recs[tb.name] = history.NewRecorder()
		wgs = append(wgs, historyWorkload(c, recs[tb.name], tb.name, tb.level, 3, 24, stop))
	}
	kills := 3
	if raceDetector {
		kills = 2
	}
	for k := range kills {
		time.Sleep(1500 * time.Millisecond)
		tb := tables[k%2].name
		victim := c.Leader(tb, uint32(k%2), 10*time.Second)
		t.Logf("kill %d: node %s, leader of %s/%d", k+1, c.ID(victim), tb, k%2)
		c.Kill(victim)
		time.Sleep(1200 * time.Millisecond)
		c.Start(victim)
	}
	time.Sleep(time.Second)
	close(stop)
	for _, wg := range wgs {
		wg.Wait()
	}

	dir := t.TempDir()
	for _, tb := range tables {
		ops := recs[tb.name].Ops()
		path := filepath.Join(dir, tb.name+".jsonl")
		if err := history.WriteFile(path, ops); err != nil {
			t.Fatal(err)
		}
		n := history.Count(ops)
		pushes, pulls, unknown := n.Pushes, n.Pulls, n.Unknown
		t.Logf("%s: %d acknowledged pushes, %d pulls, %d unknown outcomes", tb.name, pushes, pulls, unknown)
		if pushes < 50 || pulls < 50 {
			t.Errorf("%s: only %d pushes and %d pulls completed", tb.name, pushes, pulls)
		}
		// Final rows, read linearizably once the shards converged.
		for s := range uint32(2) {
			if sums := c.WaitConverged(tb.name, s, 30*time.Second); !allEqual(sums) {
				t.Errorf("%s/%d: replica checksums differ: %v", tb.name, s, sums)
			}
		}
		keys := make([]uint64, 24)
		for i := range keys {
			keys[i] = uint64(i)
		}
		out := make([]float32, 2*len(keys))
		if err := cl.Pull(ctx, tb.name, keys, out, client.WithConsistency(client.Linearizable)); err != nil {
			t.Fatal(err)
		}
		final := map[uint64]int64{}
		for i, k := range keys {
			final[k] = int64(out[2*i])
		}
		if fr := history.CheckFinal(ops, final); !fr.OK() || fr.Lost != 0 || fr.Doubled != 0 {
			t.Errorf("%s: %v (history in %s)", tb.name, fr, path)
		}
		switch tb.name {
		case "hlin":
			res, err := history.CheckLinearizable(ops, time.Minute, filepath.Join(dir, "hlin.html"))
			if err != nil {
				t.Fatal(err)
			}
			if !res.OK {
				t.Errorf("hlin: not linearizable: %v (history %s)", res, path)
			}
		case "hbnd":
			// The bound is measured by the serving node's clock, allowed to
			// run up to ClockRateAllowance slow; the history's clock is the
			// test's, on the same machine.
			allowance := time.Duration(float64(bound) * api.ClockRateAllowance)
			v, err := history.CheckBounded(ops, bound, allowance)
			if err != nil {
				t.Fatal(err)
			}
			for i, x := range v {
				if i < 5 {
					t.Errorf("hbnd: %v", x)
				}
			}
			if len(v) > 0 {
				t.Errorf("hbnd: %d staleness violations (history %s)", len(v), path)
			}
		}
	}
}

func allEqual(sums []uint64) bool {
	for _, s := range sums {
		if s != sums[0] {
			return false
		}
	}
	return true
}
