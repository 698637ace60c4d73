package metrics

import (
	"os"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/raftps/raftps/shard/shardpb"
	"golang.org/x/sys/unix"
)

// loadBounds are the latency buckets of NodeLoad, in seconds: 100 µs to
// about 6 s, each 2.5 times the last, as raftps_request_duration_seconds.
var loadBounds = func() []float64 {
	b := make([]float64, 13)
	for i, v := 0, 100e-6; i < len(b); i, v = i+1, v*2.5 {
		b[i] = v
	}
	return b
}()

// load counts the data calls for the dashboard (NodeLoad): cheap atomics
// beside the labelled Prometheus series, which a peer would have to gather
// and sum to answer the same question.
type load struct {
	pullRows, pushRows, pulls, pushes atomic.Uint64
	pullLat, pushLat                  [14]atomic.Uint64 // len(loadBounds)+1
}

func (l *load) call(rpc string, seconds float64) {
	i := sort.SearchFloat64s(loadBounds, seconds)
	switch rpc {
	case "Pull", "PullBatch":
		l.pulls.Add(1)
		l.pullLat[i].Add(1)
	case "Push", "PushBatch":
		l.pushes.Add(1)
		l.pushLat[i].Add(1)
	}
}

// Load returns what the node served since it started, and its disk (the
// file system of dataDir) and memory.
func (r *Registry) Load(dataDir string) *shardpb.NodeLoad {
	l := &r.load
	out := &shardpb.NodeLoad{
		PullRows: l.pullRows.Load(), PushRows: l.pushRows.Load(), Pulls: l.pulls.Load(), Pushes: l.pushes.Load(),
		LatencyBounds: loadBounds,
		PullLatency:   make([]uint64, len(l.pullLat)),
		PushLatency:   make([]uint64, len(l.pushLat)),
		RssBytes:      rss(),
	}
	for i := range l.pullLat {
		out.PullLatency[i], out.PushLatency[i] = l.pullLat[i].Load(), l.pushLat[i].Load()
	}
	var fs unix.Statfs_t
	if dataDir != "" && unix.Statfs(dataDir, &fs) == nil {
		out.DiskFreeBytes, out.DiskSizeBytes = fs.Bavail*uint64(fs.Bsize), fs.Blocks*uint64(fs.Bsize)
	}
	return out
}

// rss is the process's resident memory, 0 where /proc cannot tell.
func rss() uint64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return 0
	}
	pages, err := strconv.ParseUint(f[1], 10, 64)
	if err != nil {
		return 0
	}
	return pages * uint64(os.Getpagesize())
}
