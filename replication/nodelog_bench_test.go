package replication

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	"go.etcd.io/bbolt"
)

// BenchmarkLogAppend: G groups append one entry of 64 KiB each (a batch of
// pushes) at once, as a node's groups do under push load, with fsync on;
// each b.N step is one such round across all groups. "files" is a
// raft-boltdb file per group as OpenRaft opened them before the shared
// log; "shared" one NodeLog for all. Run with -benchtime Nx, alternated:
//
//	go test ./replication -run '^$' -bench 'BenchmarkLogAppend' -benchtime 200x -count 2
func BenchmarkLogAppend(b *testing.B) {
	for _, groups := range []int{4, 16, 64} {
		for _, kind := range []string{"files", "shared"} {
			b.Run(fmt.Sprintf("%s/groups=%d", kind, groups), func(b *testing.B) {
				root := b.TempDir()
				stores := make([]raft.LogStore, groups)
				var nl *NodeLog
				if kind == "shared" {
					var err error
					if nl, err = OpenNodeLog(NodeLogConfig{Root: root}); err != nil {
						b.Fatal(err)
					}
					defer nl.Close()
				}
				for i := range stores {
					dir := filepath.Join(root, "g", fmt.Sprint(i))
					if err := os.MkdirAll(dir, 0o755); err != nil {
						b.Fatal(err)
					}
					if nl != nil {
						g, err := nl.openGroup(dir)
						if err != nil {
							b.Fatal(err)
						}
						stores[i] = g
						continue
					}
					s, err := raftboltdb.New(raftboltdb.Options{Path: filepath.Join(dir, "raft.db"),
						BoltOptions: &bbolt.Options{NoFreelistSync: true, FreelistType: bbolt.FreelistMapType}})
					if err != nil {
						b.Fatal(err)
					}
					defer s.Close()
					stores[i] = s
				}
				data := make([]byte, benchEntryBytes)
				b.SetBytes(int64(groups * len(data)))
				cpu0 := cpuTime()
				b.ResetTimer()
				for n := range b.N {
					var wg sync.WaitGroup
					for _, s := range stores {
						wg.Go(func() {
							if err := s.StoreLogs([]*raft.Log{{Index: uint64(n + 1), Term: 1, Type: raft.LogCommand, Data: data}}); err != nil {
								b.Error(err)
							}
						})
					}
					wg.Wait()
				}
				b.StopTimer()
				b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
				if nl != nil {
					c, w := nl.Stats()
					b.ReportMetric(float64(w)/float64(c), "writes/commit")
				}
			})
		}
	}
}

// cpuTime is the CPU time the process has used: the appends' cost on a
// machine whose cores the servers share.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

var benchEntryBytes = func() int {
	if s := os.Getenv("RAFTPS_BENCH_ENTRY_KIB"); s != "" {
		var k int
		fmt.Sscan(s, &k)
		return k << 10
	}
	return 64 << 10
}()
