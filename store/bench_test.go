package store

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The engine benchmark: Lookup and Apply of batches of 4096 distinct keys
// drawn from Zipf(1.1) over a table of R rows, for the store and for a plain
// map[uint64][]float32 with the same initializer and SGD, in one run so the
// ratio is not at the mercy of a noisy machine. Tables are built once per
// (rows, dim, impl) and freed before the next, so the 10M x 256 case needs
// about 11 GiB at a time.
//
//	go test ./store -run '^$' -bench Engine -benchtime 2s -timeout 60m
//	go test ./store -run '^$' -bench Engine -bench.rows 1000000 -bench.dims 64

var (
	benchRows = flag.String("bench.rows", "1000000,10000000", "comma-separated table sizes for BenchmarkEngine")
	benchDims = flag.String("bench.dims", "16,64,256", "comma-separated dims for BenchmarkEngine")
)

const benchBatch = 4096

func parseInts(b *testing.B, s string) []int {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			b.Fatalf("bad number %q: %v", f, err)
		}
		out = append(out, n)
	}
	return out
}

// engine is what both implementations offer the benchmark.
type engine interface {
	Lookup(keys []uint64, out []float32) error
	Apply(keys []uint64, grads []float32) error
}

// mapEngine is the baseline: the obvious Go implementation.
type mapEngine struct {
	mu   sync.RWMutex
	cfg  TableConfig
	rows map[uint64][]float32
}

func (m *mapEngine) Lookup(keys []uint64, out []float32) error {
	dim := m.cfg.Dim
	m.mu.RLock()
	defer m.mu.RUnlock()
	for i, k := range keys {
		if row, ok := m.rows[k]; ok {
			copy(out[i*dim:(i+1)*dim], row)
		} else {
			initRow(m.cfg.Init, m.cfg.Seed, k, out[i*dim:(i+1)*dim])
		}
	}
	return nil
}

func (m *mapEngine) Apply(keys []uint64, grads []float32) error {
	dim, lr := m.cfg.Dim, m.cfg.Optimizer.LR
	m.mu.Lock()
	defer m.mu.Unlock()
	for i, k := range keys {
		row, ok := m.rows[k]
		if !ok {
			row = make([]float32, dim)
			initRow(m.cfg.Init, m.cfg.Seed, k, row)
			m.rows[k] = row
		}
		g := grads[i*dim : (i+1)*dim]
		for c := range row {
			row[c] = row[c] - float32(lr*g[c])
		}
	}
	return nil
}

// zipfBatches returns n batches of benchBatch distinct keys, ranks drawn from
// Zipf(1.1) over [0, rows) and mapped to the keys the table was built with.
func zipfBatches(rows, n int) [][]uint64 {
	rng := rand.New(rand.NewPCG(11, uint64(rows)))
	z := rand.NewZipf(rng, 1.1, 1, uint64(rows-1))
	out := make([][]uint64, n)
	seen := make(map[uint64]bool, benchBatch)
	for i := range out {
		clear(seen)
		b := make([]uint64, 0, benchBatch)
		for len(b) < benchBatch {
			r := z.Uint64()
			if !seen[r] {
				seen[r] = true
				b = append(b, benchKey(r))
			}
		}
		out[i] = b
	}
	return out
}

func benchKey(rank uint64) uint64 { return fmix64(rank + 1) }

func heapInUse() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

func buildEngine(b *testing.B, impl string, cfg TableConfig, rows int) (engine, float64) {
	before := heapInUse()
	var e engine
	if impl == "store" {
		e = mustTable(b, cfg)
	} else {
		e = &mapEngine{cfg: cfg, rows: make(map[uint64][]float32)}
	}
	keys := make([]uint64, 0, benchBatch)
	zero := make([]float32, benchBatch*cfg.Dim)
	for r := 0; r < rows; r++ {
		keys = append(keys, benchKey(uint64(r)))
		if len(keys) == benchBatch || r == rows-1 {
			if err := e.Apply(keys, zero[:len(keys)*cfg.Dim]); err != nil {
				b.Fatal(err)
			}
			keys = keys[:0]
		}
	}
	perRow := float64(heapInUse()-before) / float64(rows)
	if t, ok := e.(*Table); ok {
		perRow = float64(t.MemoryBytes()) / float64(rows)
	}
	return e, perRow
}

func BenchmarkEngine(b *testing.B) {
	debug.SetMemoryLimit(20 << 30)
	defer debug.SetMemoryLimit(-1)
	for _, rows := range parseInts(b, *benchRows) {
		batches := zipfBatches(rows, 64)
		for _, dim := range parseInts(b, *benchDims) {
			cfg := TableConfig{Name: "bench", Dim: dim, Init: Initializer{Kind: InitUniform, Scale: 0.01}, Optimizer: DefaultOptimizer(SGD), Seed: 1}
			rng := rand.New(rand.NewPCG(1, 2))
			grads := make([]float32, benchBatch*dim)
			for i := range grads {
				grads[i] = rng.Float32() - 0.5
			}
			for _, impl := range []string{"store", "map"} {
				name := fmt.Sprintf("rows=%s/dim=%d/impl=%s", human(rows), dim, impl)
				b.Run(name, func(b *testing.B) {
					e, perRow := buildEngine(b, impl, cfg, rows)
					defer func() {
						e = nil
						runtime.GC()
						debug.FreeOSMemory()
					}()
					out := make([]float32, benchBatch*dim)
					op := func(name string, fn func(keys []uint64) error) {
						b.Run("op="+name, func(b *testing.B) {
							for i := 0; b.Loop(); i++ {
								if err := fn(batches[i%len(batches)]); err != nil {
									b.Fatal(err)
								}
							}
							b.ReportMetric(float64(b.N*benchBatch)/b.Elapsed().Seconds(), "rows/s")
							b.ReportMetric(perRow, "B/row")
						})
					}
					op("lookup", func(keys []uint64) error { return e.Lookup(keys, out) })
					op("apply", func(keys []uint64) error { return e.Apply(keys, grads) })
				})
			}
		}
	}
}

func human(n int) string {
	if n%1000000 == 0 {
		return strconv.Itoa(n/1000000) + "M"
	}
	if n%1000 == 0 {
		return strconv.Itoa(n/1000) + "k"
	}
	return strconv.Itoa(n)
}

// BenchmarkSnapshotStall writes a snapshot of a table (10M rows of dim 64 by
// default) to a file while one goroutine applies batches as fast as it can,
// and reports the slowest Apply during the snapshot next to the slowest of
// the same number of Applies without one.
//
//	go test ./store -run '^$' -bench SnapshotStall -benchtime 1x
func BenchmarkSnapshotStall(b *testing.B) {
	rows := 10000000
	if r := parseInts(b, *benchRows); len(r) > 0 {
		rows = slices.Max(r)
	}
	cfg := TableConfig{Name: "stall", Dim: 64, Init: Initializer{Kind: InitUniform, Scale: 0.01}, Optimizer: DefaultOptimizer(Adagrad), Seed: 1}
	e, _ := buildEngine(b, "store", cfg, rows)
	tab := e.(*Table)
	batches := zipfBatches(rows, 64)
	grads := make([]float32, benchBatch*cfg.Dim)
	for i := range grads {
		grads[i] = 0.001
	}
	applyLoop := func(until func(n int) bool) []time.Duration {
		var lat []time.Duration
		for n := 0; !until(n); n++ {
			start := time.Now()
			if err := tab.Apply(batches[n%len(batches)], grads); err != nil {
				b.Fatal(err)
			}
			lat = append(lat, time.Since(start))
		}
		slices.Sort(lat)
		return lat
	}
	pct := func(lat []time.Duration, p float64) float64 {
		if len(lat) == 0 {
			return 0
		}
		return float64(lat[min(len(lat)-1, int(p*float64(len(lat))))].Microseconds()) / 1000
	}
	// Warm up: the first Applies after building fault in scratch memory.
	applyLoop(func(n int) bool { return n >= 64 })
	for range b.N {
		f, err := os.CreateTemp(b.TempDir(), "snap")
		if err != nil {
			b.Fatal(err)
		}
		var done sync.WaitGroup
		var finished atomic.Bool
		var snapTime time.Duration
		var snapBytes, kept int64
		base := tab.MemoryBytes()
		s := tab.Snapshot()
		done.Go(func() {
			start := time.Now()
			n, err := s.WriteTo(f)
			snapTime, snapBytes = time.Since(start), n
			kept = tab.MemoryBytes() - base // what copy-on-write held at the end
			if err == nil {
				err = f.Sync()
			}
			finished.Store(true)
			if err != nil {
				b.Error(err)
			}
		})
		during := applyLoop(func(int) bool { return finished.Load() })
		done.Wait()
		s.Release()
		f.Close()
		without := applyLoop(func(i int) bool { return i >= len(during) })
		for _, m := range []struct {
			name string
			lat  []time.Duration
		}{{"during", during}, {"without", without}} {
			b.ReportMetric(pct(m.lat, 0.5), "p50-apply-ms-"+m.name)
			b.ReportMetric(pct(m.lat, 0.99), "p99-apply-ms-"+m.name)
			b.ReportMetric(pct(m.lat, 1), "max-apply-ms-"+m.name)
		}
		b.ReportMetric(float64(len(during)), "applies-during")
		b.ReportMetric(snapTime.Seconds(), "snapshot-s")
		b.ReportMetric(float64(snapBytes)/(1<<20)/snapTime.Seconds(), "snapshot-MiB/s")
		b.ReportMetric(float64(kept)/(1<<20), "MiB-copied-on-write")
	}
}
