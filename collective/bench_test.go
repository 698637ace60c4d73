package collective

import (
	"context"
	"fmt"
	"net"
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
				defer c.Close()
				defer s.Close()
			}
			b.SetBytes(total)
			b.ResetTimer()
			start := time.Now()
			var wg sync.WaitGroup
			for _, cs := range conns {
				wg.Add(2)
				go func() {
					defer wg.Done()
					buf := make([]byte, 512<<10)
					for range b.N {
						for sent := 0; sent < total; sent += len(buf) {
							if _, err := cs[0].Write(buf); err != nil {
								b.Error(err)
								return
							}
						}
					}
				}()
				go func() {
					defer wg.Done()
					buf := make([]byte, 512<<10)
					for left := int64(total) * int64(b.N); left > 0; {
						m, err := cs[1].Read(buf[:min(int64(len(buf)), left)])
						if err != nil {
							b.Error(err)
							return
						}
						left -= int64(m)
					}
				}()
			}
			wg.Wait()
			sec := time.Since(start).Seconds()
			b.StopTimer()
			per := float64(total) * float64(b.N) / sec / 1e9
			b.ReportMetric(per, "stream-GB/s")
			b.ReportMetric(per*float64(n), "aggregate-GB/s")
		})
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
