package client

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/raftps/raftps/shard/shardpb"
)

// hotWindow is how often a client refreshes its view of a table's hot sets:
// the nodes decide them once per window (1 s).
const hotWindow = time.Second

// hotView is a client's copy of a table's hot sets, refreshed at most once a
// hotWindow by the pull that finds it old (the others use it as it is).
type hotView struct {
	at         time.Time
	refreshing bool
	shards     map[uint32]*hotShardView
}

type hotShardView struct {
	keys          map[uint64]bool
	addrs         []string // read replicas
	term, version uint64   // of the leader that decided it
}

// hotShardsOf returns the client's view of table's hot sets, and starts a
// background refresh if it is older than a window and none runs: no pull
// waits for one.
func (c *Client) hotShardsOf(spec *shardpb.TableSpec) map[uint32]*hotShardView {
	if spec.HotThreshold <= 0 {
		return nil
	}
	c.mu.Lock()
	v := c.hot[spec.Name]
	if v == nil {
		v = &hotView{}
		c.hot[spec.Name] = v
	}
	current := v.shards
	if v.refreshing || time.Since(v.at) < hotWindow || c.closed {
		c.mu.Unlock()
		return current
	}
	v.refreshing = true
	var addrs []string
	if tm := c.maps[spec.Name]; tm != nil {
		for _, a := range tm.addr {
			addrs = append(addrs, a)
		}
	}
	c.mu.Unlock()
	addrs = append(addrs, c.cfg.Addrs...)
	slices.Sort(addrs)
	addrs = slices.Compact(addrs)
	go c.fetchHot(spec.Name, v, addrs)
	return current
}

// fetchHot asks every node for the hot sets of the shards it leads (one
// call each, in parallel) and replaces v's.
func (c *Client) fetchHot(table string, v *hotView, addrs []string) {
	rctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	shards := map[uint32]*hotShardView{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, a := range addrs {
		wg.Go(func() {
			st, err := c.stub(a)
			if err != nil {
				return
			}
			resp, err := st.HotKeys(rctx, &shardpb.HotKeysRequest{Table: table})
			if err != nil {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			for _, hs := range resp.Shards {
				addHotShard(shards, hs)
			}
		})
	}
	wg.Wait()
	c.mu.Lock()
	v.shards, v.at, v.refreshing = shards, time.Now(), false
	c.mu.Unlock()
}

// addHotShard adds a hot set a node reported to shards, one per shard.
// When two nodes both think they lead a shard (one cut off, or not told
// yet), it keeps the later leader's: by term (or chain epoch), then by
// version, which restarts at each leader.
func addHotShard(shards map[uint32]*hotShardView, hs *shardpb.HotShard) {
	if old, ok := shards[hs.Shard]; ok && (old.term > hs.Term || (old.term == hs.Term && old.version >= hs.Version)) {
		return
	}
	sv := &hotShardView{keys: make(map[uint64]bool, len(hs.Keys)), addrs: hs.ReplicaAddrs, term: hs.Term, version: hs.Version}
	for _, k := range hs.Keys {
		sv.keys[k.Key] = true
	}
	shards[hs.Shard] = sv
}
