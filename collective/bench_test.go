package collective

import (
	"context"
	"fmt"
	"net"
	"slices"
	"sync"
	"testing"
	"time"
)

// benchSizes are the buffer sizes of BenchmarkAllReduce, in bytes.
var benchSizes = []int{8, 64 << 10, 4 << 20, 64 << 20, 256 << 20}

// benchAllReduce times b.N AllReduces of size bytes on every rank and
// reports algorithm and bus bandwidth as nccl-tests defines them:
// algbw = size/time, busbw = algbw * 2(n-1)/n.
func benchAllReduce(b *testing.B, n, size int, mod func(*Config)) {
	gs := makeGroup(b, n, mod)
	bufs := make([][]float32, n)
	for r := range bufs {
		bufs[r] = make([]float32, size/4)
	}
	// One warm-up round.
	noErrors(b, onAll(gs, func(r int, g *Group) error { return g.AllReduce(context.Background(), bufs[r], Sum) }))
	b.SetBytes(int64(size))
	b.ResetTimer()
	start := time.Now()
	noErrors(b, onAll(gs, func(r int, g *Group) error {
		for range b.N {
			if err := g.AllReduce(context.Background(), bufs[r], Sum); err != nil {
				return err
			}
		}
		return nil
	}))
	per := time.Since(start).Seconds() / float64(b.N)
	b.StopTimer()
	algbw := float64(size) / per / 1e9
	b.ReportMetric(per*1e6, "us/op")
	b.ReportMetric(algbw, "algbw-GB/s")
	b.ReportMetric(algbw*2*float64(n-1)/float64(n), "busbw-GB/s")
}

func BenchmarkAllReduce(b *testing.B) {
	for _, n := range []int{2, 4, 8} {
		for _, size := range benchSizes {
			b.Run(fmt.Sprintf("N=%d/%s", n, byteSize(size)), func(b *testing.B) {
				benchAllReduce(b, n, size, nil)
			})
		}
	}
}

// BenchmarkAllReduceCrossover compares the two algorithms around the
// default threshold; DefaultSmallBytes comes from it.
func BenchmarkAllReduceCrossover(b *testing.B) {
	for _, n := range []int{2, 4, 8} {
		for _, size := range []int{1 << 10, 4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20} {
			for _, algo := range []Algorithm{RecursiveDoubling, Ring} {
				b.Run(fmt.Sprintf("N=%d/%s/%s", n, byteSize(size), algo), func(b *testing.B) {
					benchAllReduce(b, n, size, func(c *Config) { c.Algorithm = algo })
				})
			}
		}
	}
}

// BenchmarkLoopbackTCP measures raw loopback TCP throughput with the same
// number of streams as the ring has links (n): n connections, each written
// by one goroutine in 512 KiB writes and drained by another. It reports the
// per-stream rate, which is what busbw of the ring should be compared with,
// and the aggregate.
func BenchmarkLoopbackTCP(b *testing.B) {
	for _, n := range []int{2, 4, 8} {
		b.Run(fmt.Sprintf("streams=%d", n), func(b *testing.B) {
			const total = 64 << 20 // bytes per stream per iteration
			conns := loopbackConns(b, n)
			b.SetBytes(total)
			b.ResetTimer()
			sec := loopbackRun(b, conns, total, b.N, loopbackBufs(n, loopbackPiece))
			b.StopTimer()
			per := float64(total) * float64(b.N) / sec / 1e9
			b.ReportMetric(per, "stream-GB/s")
			b.ReportMetric(per*float64(n), "aggregate-GB/s")
		})
	}
}

// loopbackConns opens n loopback TCP connections (client and server ends),
// closed when the benchmark ends.
func loopbackConns(b *testing.B, n int) [][2]net.Conn {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	conns := make([][2]net.Conn, n)
	for i := range conns {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			b.Fatal(err)
		}
		s, err := ln.Accept()
		if err != nil {
			b.Fatal(err)
		}
		conns[i] = [2]net.Conn{c, s}
		b.Cleanup(func() { c.Close(); s.Close() })
	}
	return conns
}

// loopbackPiece is the size of every write (and the most read at once) of
// the loopback transfers.
const loopbackPiece = 512 << 10

// loopbackBufs returns, for each of n connections, a buffer to send from
// and one to receive into, of size bytes each (a multiple of
// loopbackPiece). Allocated once per benchmark, so that no transfer pays
// for first touching its memory.
func loopbackBufs(n, size int) [][2][]byte {
	bufs := make([][2][]byte, n)
	for i := range bufs {
		bufs[i] = [2][]byte{make([]byte, size), make([]byte, size)}
		for j := range bufs[i] {
			for k := range bufs[i][j] {
				bufs[i][j][k] = byte(k)
			}
		}
	}
	return bufs
}

// loopbackRun pushes iters*total bytes through every connection at once
// (one writer and one reader goroutine each, writes of loopbackPiece) and
// returns the elapsed seconds. bufs[i] holds connection i's buffers, which
// the writer sends from and the reader receives into, loopbackPiece at a
// time, wrapping around: buffers of loopbackPiece bytes stay in cache
// ("hot"), buffers of total bytes do not, as a ring allreduce of total
// bytes sends from and receives into memory that is not in cache ("cold").
func loopbackRun(b *testing.B, conns [][2]net.Conn, total, iters int, bufs [][2][]byte) float64 {
	const piece = loopbackPiece
	start := time.Now()
	var wg sync.WaitGroup
	for i, cs := range conns {
		src, dst := bufs[i][0], bufs[i][1]
		wg.Add(2)
		go func() {
			defer wg.Done()
			for range iters {
				for sent := 0; sent < total; sent += piece {
					off := sent % len(src)
					if _, err := cs[0].Write(src[off : off+piece]); err != nil {
						b.Error(err)
						return
					}
				}
			}
		}()
		go func() {
			defer wg.Done()
			for got := int64(0); got < int64(total)*int64(iters); {
				off := int(got % int64(len(dst)))
				m, err := cs[1].Read(dst[off:min(len(dst), off+piece)])
				if err != nil {
					b.Error(err)
					return
				}
				got += int64(m)
			}
		}()
	}
	wg.Wait()
	return time.Since(start).Seconds()
}

// BenchmarkRingSchedule compares, in one run and interleaved round by
// round, the ring's schedules (lockstep: the ring before pipelining, with
// the Go add loop; stepmajor: steps in order but pipelined; wavefront: the
// default; lag1: the wavefront with a lag of one chunk) with raw
// loopback TCP through as many streams as ranks, 64 MiB per stream: "hot"
// as BenchmarkLoopbackTCP (the same 512 KiB buffers again and again, in
// cache), and "cold" from and into 64 MiB buffers, as the ring sends from
// and receives into a buffer larger than the cache. Each iteration runs one
// allreduce of each schedule and each loopback transfer, in an order that
// rotates, so that load from elsewhere on the machine hits all of them
// alike. It reports each one's bus bandwidth (for loopback, the per-stream
// rate) from the median times, each schedule's busbw as a percentage of
// the hot loopback rate and the wavefront's as a percentage of the cold
// one (medians of per-iteration ratios), and the wavefront's speedup over
// lockstep.
func BenchmarkRingSchedule(b *testing.B) {
	scheds := []struct {
		name  string
		sched int
		lag   int
	}{{"lockstep", schedLockstep, 1}, {"stepmajor", schedStepMajor, 1}, {"wavefront", schedWavefront, 0}, {"lag1", schedWavefront, 1}}
	for _, n := range []int{2, 4, 8} {
		for _, size := range []int{4 << 20, 64 << 20} {
			b.Run(fmt.Sprintf("N=%d/%s", n, byteSize(size)), func(b *testing.B) {
				gs := makeGroup(b, n, func(c *Config) { c.Algorithm = Ring })
				conns := loopbackConns(b, n)
				bufs := make([][]float32, n)
				for r := range bufs {
					bufs[r] = make([]float32, size/4)
				}
				const wire = 64 << 20
				hotBufs, cold := loopbackBufs(n, loopbackPiece), loopbackBufs(n, wire)
				hot, coldLoop := len(scheds), len(scheds)+1
				sec := make([][]float64, len(scheds)+2) // per iteration
				run := func(j int) float64 {
					switch j {
					case hot:
						return loopbackRun(b, conns, wire, 1, hotBufs)
					case coldLoop:
						return loopbackRun(b, conns, wire, 1, cold)
					}
					ringSched, ringLag = scheds[j].sched, scheds[j].lag
					defer func() { ringSched, ringLag = schedWavefront, 0 }()
					start := time.Now()
					noErrors(b, onAll(gs, func(r int, g *Group) error {
						return g.AllReduce(context.Background(), bufs[r], Sum)
					}))
					return time.Since(start).Seconds()
				}
				for j := range sec {
					run(j) // warm up
				}
				b.ResetTimer()
				for i := range b.N {
					for j := range sec {
						j = (j + i) % len(sec)
						sec[j] = append(sec[j], run(j))
					}
				}
				b.StopTimer()
				// Medians, which a burst of load elsewhere moves less than
				// means; the percentages are medians of each iteration's own
				// ratio, so that the host's loopback rate drifting between
				// iterations (it does, by up to 30% within minutes) cancels
				// out of them.
				median := func(ts []float64) float64 {
					ts = slices.Clone(ts)
					slices.Sort(ts)
					return (ts[(len(ts)-1)/2] + ts[len(ts)/2]) / 2
				}
				busFactor := float64(size) / float64(wire) * 2 * float64(n-1) / float64(n)
				pct := func(j, ref int) float64 {
					rs := make([]float64, len(sec[j]))
					for i := range rs {
						rs[i] = 100 * busFactor * sec[ref][i] / sec[j][i]
					}
					return median(rs)
				}
				med := make([]float64, len(sec))
				for j, ts := range sec {
					med[j] = median(ts)
				}
				rate := func(j int) float64 { return float64(wire) / med[j] / 1e9 }
				b.ReportMetric(rate(hot), "loopback-GB/s")
				b.ReportMetric(rate(coldLoop), "loopback-cold-GB/s")
				for j, sc := range scheds {
					bus := float64(size) / med[j] / 1e9 * 2 * float64(n-1) / float64(n)
					b.ReportMetric(bus, sc.name+"-busbw-GB/s")
					b.ReportMetric(pct(j, hot), sc.name+"-%loopback")
				}
				b.ReportMetric(pct(2, coldLoop), "wavefront-%cold")
				b.ReportMetric(med[0]/med[2], "wavefront-speedup")
			})
		}
	}
}

func byteSize(n int) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<10:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}
