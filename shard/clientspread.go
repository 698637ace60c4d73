package shard

import (
	"context"
	"fmt"
	"hash/maphash"
	"slices"
	"sync"
	"time"

	"github.com/raftps/raftps/shard/shardpb"
)

// hotView is a client's copy of a table's hot sets, refreshed at most once a
// HotWindow by the pull that finds it old (the others use it as it is).
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
	if v.refreshing || time.Since(v.at) < HotWindow || c.closed {
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

// spreadPart is one request of a spread pull: n keys of one shard, to one
// node; pos are the keys' places in the shard's part of the split, nil when
// the part is the whole shard.
type spreadPart struct {
	shard uint32
	pos   []int
	n     int
	addr  string
	req   *shardpb.PullRequest
}

// pullSpread is PullOpts for the bounded and eventual levels, and for
// linearizable pulls of chain tables; level is o's, or the table's.
func (c *Client) pullSpread(ctx context.Context, spec *shardpb.TableSpec, keys []uint64, out []float32, o PullOptions, level shardpb.Consistency) error {
	table, dim := spec.Name, int(spec.Dim)
	rowBytes := dim * 4
	sp := splitKeys(keys, spec.Shards)
	if len(c.replicaAddrs(table, 0)) == 0 {
		// The client knows the table but not its placement (it created the
		// table): learn it, or spread pulls would all go to the leaders.
		c.mu.Lock()
		c.refreshSpecLocked(table)
		c.mu.Unlock()
	}
	var hot map[uint32]*hotShardView
	if level != shardpb.Consistency_CONSISTENCY_LINEARIZABLE {
		// Read replicas serve no linearizable pull (of a chain table,
		// spread over its members); they would send every one back.
		hot = c.hotShardsOf(spec)
	}
	rows := make([][]byte, spec.Shards)
	// Each pull ranks the nodes in a random order and asks every shard's
	// first-ranked replica (a hot key's: replica or read replica): over
	// many pulls each candidate gets an even share, and one pull's shards
	// gather on few nodes, a call each, instead of one call to every node.
	seed := maphash.MakeSeed()
	first := func(a, b []string) string {
		best, bestRank := "", uint64(0)
		for _, list := range [2][]string{a, b} {
			for _, addr := range list {
				if r := maphash.String(seed, addr); best == "" || r < bestRank {
					best, bestRank = addr, r
				}
			}
		}
		return best
	}
	var parts []*spreadPart
	for s := range sp.keys {
		if len(sp.keys[s]) == 0 {
			continue
		}
		reps := c.replicaAddrs(table, uint32(s))
		if len(reps) == 0 {
			if a := c.leader(groupID(table, uint32(s))); a != "" {
				reps = []string{a}
			}
		}
		hs := hot[uint32(s)]
		cold := first(reps, nil)
		hotAddr := ""
		if hs != nil {
			hotAddr = first(reps, hs.addrs)
		}
		if hotAddr == "" || hotAddr == cold {
			// The usual case: the whole shard goes to one node.
			parts = append(parts, &spreadPart{shard: uint32(s), addr: cold, n: len(sp.keys[s])})
			continue
		}
		rows[s] = make([]byte, len(sp.keys[s])*rowBytes)
		coldPart, hotPart := &spreadPart{shard: uint32(s), addr: cold}, &spreadPart{shard: uint32(s), addr: hotAddr}
		for j, k := range sp.keys[s] {
			p := coldPart
			if hs.keys[k] {
				p = hotPart
			}
			p.pos = append(p.pos, j)
			p.n++
		}
		for _, p := range []*spreadPart{coldPart, hotPart} {
			if p.n > 0 {
				parts = append(parts, p)
			}
		}
	}
	for _, p := range parts {
		ks := sp.keys[p.shard]
		if p.pos != nil {
			ks = make([]uint64, p.n)
			for i, j := range p.pos {
				ks[i] = sp.keys[p.shard][j]
			}
		}
		p.req = &shardpb.PullRequest{Table: table, Shard: p.shard, Keys: KeysBytes(ks), Consistency: o.Level,
			Epoch: c.epoch(table, p.shard), StalenessBoundNs: int64(o.StalenessBound), AllowWeaker: o.AllowWeaker}
	}
	place := func(p *spreadPart, addr string, values []byte) error {
		if len(values) != p.n*rowBytes {
			return fmt.Errorf("raftps client: %s answered %d bytes for %d keys of dim %d", addr, len(values), p.n, dim)
		}
		if p.pos == nil {
			rows[p.shard] = values // the answer's bytes, as the linearizable path keeps them
			return nil
		}
		for i, j := range p.pos {
			copy(rows[p.shard][j*rowBytes:(j+1)*rowBytes], values[i*rowBytes:(i+1)*rowBytes])
		}
		return nil
	}
	// A part its node did not serve is asked again at the shard's replicas,
	// with the usual retries through leader changes and map moves.
	single := func(p *spreadPart) error {
		return c.shardRetry(ctx, table, p.shard, "", func(ctx context.Context, addr string) error {
			st, err := c.stub(addr)
			if err != nil {
				return err
			}
			p.req.Epoch = c.epoch(table, p.shard)
			resp, err := st.Pull(ctx, p.req)
			if err != nil {
				return err
			}
			return place(p, addr, resp.Values)
		})
	}
	byNode := map[string][]*spreadPart{}
	var unknown []*spreadPart
	for _, p := range parts {
		if p.addr == "" {
			unknown = append(unknown, p)
		} else {
			byNode[p.addr] = append(byNode[p.addr], p)
		}
	}
	errs := make([]error, len(parts))
	index := make(map[*spreadPart]int, len(parts))
	for i, p := range parts {
		index[p] = i
	}
	var wg sync.WaitGroup
	for _, p := range unknown {
		wg.Go(func() { errs[index[p]] = single(p) })
	}
	for addr, ps := range byNode {
		wg.Go(func() {
			reqs := make([]*shardpb.PullRequest, len(ps))
			for i, p := range ps {
				reqs[i] = p.req
			}
			st, err := c.stub(addr)
			var resp *shardpb.PullBatchResponse
			if err == nil {
				actx, cancel := context.WithTimeout(ctx, c.cfg.AttemptTimeout)
				resp, err = st.PullBatch(actx, &shardpb.PullBatchRequest{Parts: reqs})
				cancel()
			}
			if err == nil {
				err = checkAnswers(addr, len(ps), len(resp.Parts), len(resp.Errors))
			}
			for i, p := range ps {
				if err == nil && resp.Errors[i].GetCode() == 0 {
					if perr := place(p, addr, resp.Parts[i].Values); perr == nil {
						continue
					}
				}
				wg.Go(func() { errs[index[p]] = single(p) })
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return fmt.Errorf("pull from table %q: %w", table, err)
		}
	}
	outBytes := ValuesBytes(out)
	for i := range keys {
		s, j := sp.sh[i], sp.of[i]
		copy(outBytes[i*rowBytes:(i+1)*rowBytes], rows[s][j*rowBytes:(j+1)*rowBytes])
	}
	return nil
}

// AlterTable changes a table's consistency level, staleness bound or
// hot-key settings and returns the new spec. Each node serves the new level
// once its metadata replica has applied it; a pull that needs the stronger
// level at once asks for it (PullOptions.Level).
func (c *Client) AlterTable(ctx context.Context, req *shardpb.AlterTableRequest) (*shardpb.TableSpec, error) {
	var out *shardpb.TableSpec
	err := c.callMeta(ctx, func(ctx context.Context, s shardpb.ParameterServerClient) error {
		resp, err := s.AlterTable(ctx, req)
		if err != nil {
			return err
		}
		out = resp.Spec
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("alter table %q: %w", req.Name, err)
	}
	c.mu.Lock()
	c.tables[out.Name], c.specAt[out.Name] = out, time.Now()
	delete(c.hot, out.Name)
	c.mu.Unlock()
	return out, nil
}
