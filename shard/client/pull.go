package client

import (
	"cmp"
	"context"
	"fmt"
	"hash/maphash"
	"slices"
	"time"

	"github.com/raftps/raftps/shard/api"
	"github.com/raftps/raftps/shard/shardpb"
	"google.golang.org/grpc"
)

// PullOption chooses the consistency of one pull.
type PullOption func(*pullOptions)

type pullOptions struct {
	level       Level
	bound       time.Duration
	allowWeaker bool
}

// AtConsistency reads at c's level instead of the table's, and for
// Bounded with its bound: WithConsistency and WithStaleness in one.
func AtConsistency(c Consistency) PullOption {
	return func(o *pullOptions) {
		o.level = c.Level
		if c.Level == Bounded {
			o.bound = c.Bound
		}
	}
}

// WithConsistency reads at level l instead of the table's. A stronger level
// than the table's is always allowed; a weaker one only with AllowWeaker.
func WithConsistency(l Level) PullOption { return func(o *pullOptions) { o.level = l } }

// WithStaleness makes the pull a bounded read at bound d: tighter than a
// bounded table's own bound, or a bounded read of an eventual table (and,
// with AllowWeaker, of a linearizable one or looser than the table's). It
// implies WithConsistency(Bounded) unless another level is given.
func WithStaleness(d time.Duration) PullOption { return func(o *pullOptions) { o.bound = d } }

// AllowWeaker asks knowingly for less than the table promises: a weaker
// level, or a looser bound.
func AllowWeaker() PullOption { return func(o *pullOptions) { o.allowWeaker = true } }

// Pull fills out with the rows of keys (len(keys) × dim values, in the order
// of keys), at the table's consistency level unless an option says
// otherwise. Keys never pushed come back as the table's initial values. A
// pull of more rows than Config.MaxCallBytes holds goes as several calls,
// each row read at the level asked (the whole is not one snapshot, as a
// pull over several shards never is).
//
// Linearizable pulls go to each shard's leader (of a chain table: to any
// member, which confirms its epoch). Bounded and eventual pulls are spread
// over each shard's replicas, and the table's hot keys over their read
// replicas too; a replica that cannot serve within the bound says so, and
// the part is asked again at the shard's other replicas.
func (c *Client) Pull(ctx context.Context, table string, keys []uint64, out []float32, opts ...PullOption) (err error) {
	defer func(start time.Time) { c.metrics.observe("pull", table, len(keys), start, err) }(time.Now())
	var o pullOptions
	for _, opt := range opts {
		opt(&o)
	}
	if o.bound < 0 {
		return fmt.Errorf("raftps client: pull from table %q: %w: staleness bound %s", table, ErrBadRequest, o.bound)
	}
	if o.bound > 0 && o.level == 0 {
		o.level = Bounded
	}
	spec, err := c.spec(ctx, table)
	if err != nil {
		return err
	}
	dim := int(spec.Dim)
	if len(out) != len(keys)*dim {
		return fmt.Errorf("raftps client: pull of %d keys of table %q (dim %d) into %d values: %w", len(keys), table, dim, len(out), ErrDimMismatch)
	}
	if len(keys) == 0 {
		return nil
	}
	rows := c.rowsPerCall(dim)
	for i := 0; i < len(keys); i += rows {
		j := min(i+rows, len(keys))
		if err := c.pull(ctx, table, spec, o, keys[i:j], out[i*dim:j*dim]); err != nil {
			if len(keys) > rows {
				err = fmt.Errorf("rows %d..%d of %d (each call of at most %d rows): %w", i, j-1, len(keys), rows, err)
			}
			return err
		}
	}
	return nil
}

// pull reads one call's worth of Pull.
func (c *Client) pull(ctx context.Context, table string, spec *shardpb.TableSpec, o pullOptions, keys []uint64, out []float32) error {
	dim := int(spec.Dim)
	level := o.level.proto()
	if level == shardpb.Consistency_CONSISTENCY_UNSPECIFIED {
		level = spec.Consistency
	}
	sp := splitKeys(keys, spec.Shards)
	op := &pullOp{c: c, table: table, rowBytes: dim * 4, sp: sp, rows: make([][]byte, spec.Shards),
		base: shardpb.PullRequest{Table: table, Consistency: o.level.proto(), StalenessBoundNs: int64(o.bound), AllowWeaker: o.allowWeaker}}
	defer op.answers.release() // after the rows are copied out below
	// A chain serves linearizable pulls at any member (CRAQ): spread them.
	var parts []*part
	if level == shardpb.Consistency_CONSISTENCY_LINEARIZABLE && !api.IsChain(spec) && !spreadLinearizable {
		parts = op.leaderParts()
	} else {
		parts = op.spreadParts(spec, level)
	}
	op.reqs = make(map[*part]*shardpb.PullRequest, len(parts))
	for _, p := range parts {
		op.reqs[p] = op.request(p)
	}
	if err := c.fanOut(ctx, table, parts, op); err != nil {
		return fmt.Errorf("pull from table %q: %w", table, err)
	}
	outBytes, rowBytes := api.ValuesBytes(out), op.rowBytes
	for i := range keys {
		s, j := sp.sh[i], sp.of[i]
		copy(outBytes[i*rowBytes:(i+1)*rowBytes], op.rows[s][j*rowBytes:(j+1)*rowBytes])
	}
	return nil
}

// pullOp is the fan-out of one pull.
type pullOp struct {
	c        *Client
	table    string
	rowBytes int
	sp       *split
	base     shardpb.PullRequest
	reqs     map[*part]*shardpb.PullRequest // written before the fan-out, read only during it
	// rows[s] holds shard s's rows in the order of sp.keys[s]: a whole-shard
	// part's answer bytes as they came (no copy: they point into a message
	// answers holds), or a buffer the parts of a split shard fill at their
	// positions. Parts of one shard write disjoint rows.
	rows    [][]byte
	answers answers
	// spread: the parts are not meant for a leader, so a refused part is
	// retried at the shard's replicas from the start, not at the node that
	// refused it.
	spread bool
}

// leaderParts sends every shard to its leader: one part each.
func (o *pullOp) leaderParts() []*part {
	var parts []*part
	for s := range o.sp.keys {
		if len(o.sp.keys[s]) > 0 {
			parts = append(parts, &part{shard: uint32(s), addr: o.c.leaderOf(o.table, uint32(s))})
		}
	}
	return parts
}

// spreadParts sends every shard to one of its replicas, and its hot keys
// (below linearizable) to one of their read replicas as well. Each pull
// ranks the nodes in a random order and asks every shard's first-ranked
// candidate that answered lately: over many pulls each candidate gets an
// even share, and one pull's shards gather on few nodes, a call each,
// instead of one call to every node.
func (o *pullOp) spreadParts(spec *shardpb.TableSpec, level shardpb.Consistency) []*part {
	c, table := o.c, o.table
	o.spread = true
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
	seed := maphash.MakeSeed()
	// ranked orders a part's candidates, leaving out the silent ones: those
	// that answered lately before those a hedge beat lately, each by the
	// pull's random rank. The first is asked, the others are its hedges;
	// none when every candidate is silent (the per-shard path).
	type cand struct {
		addr  string
		grade int // 0: answered lately, 1: a hedge beat it lately
		rank  uint64
	}
	var cands []cand
	ranked := func(lists ...[]string) (string, []string) {
		cands = cands[:0]
		for _, l := range lists {
			for _, a := range l {
				if slices.ContainsFunc(cands, func(x cand) bool { return x.addr == a }) {
					continue
				}
				g := 0
				switch {
				case c.isSilent(a):
					continue // asked by the per-shard path only, last
				case c.isSlow(a):
					g = 1
				}
				cands = append(cands, cand{a, g, maphash.String(seed, a)})
			}
		}
		if len(cands) == 0 {
			return "", nil
		}
		slices.SortFunc(cands, func(a, b cand) int { return cmp.Or(cmp.Compare(a.grade, b.grade), cmp.Compare(a.rank, b.rank)) })
		alts := make([]string, len(cands)-1)
		for i, x := range cands[1:] {
			alts[i] = x.addr
		}
		return cands[0].addr, alts
	}
	var parts []*part
	for s := range o.sp.keys {
		if len(o.sp.keys[s]) == 0 {
			continue
		}
		reps := c.replicaAddrs(table, uint32(s))
		if len(reps) == 0 {
			if a := c.leader(api.GroupID(table, uint32(s))); a != "" {
				reps = []string{a}
			}
		}
		cold, coldAlts := ranked(reps)
		hs := hot[uint32(s)]
		hotAddr, hotAlts := "", []string(nil)
		if hs != nil {
			hotAddr, hotAlts = ranked(reps, hs.addrs)
		}
		if hotAddr == "" || hotAddr == cold {
			// The usual case: the whole shard goes to one node.
			parts = append(parts, &part{shard: uint32(s), addr: cold, alts: coldAlts})
			continue
		}
		o.rows[s] = make([]byte, len(o.sp.keys[s])*o.rowBytes)
		coldPart := &part{shard: uint32(s), addr: cold, alts: coldAlts, pos: []int{}}
		hotPart := &part{shard: uint32(s), addr: hotAddr, alts: hotAlts, pos: []int{}}
		for j, k := range o.sp.keys[s] {
			p := coldPart
			if hs.keys[k] {
				p = hotPart
			}
			p.pos = append(p.pos, j)
		}
		for _, p := range []*part{coldPart, hotPart} {
			if len(p.pos) > 0 {
				parts = append(parts, p)
			}
		}
	}
	return parts
}

// request is the PullRequest of a part (its epoch is set per attempt).
func (o *pullOp) request(p *part) *shardpb.PullRequest {
	req := shardpb.PullRequest{Table: o.base.Table, Shard: p.shard, Consistency: o.base.Consistency,
		StalenessBoundNs: o.base.StalenessBoundNs, AllowWeaker: o.base.AllowWeaker}
	ks := o.sp.keys[p.shard]
	if p.pos != nil {
		ks = make([]uint64, len(p.pos))
		for i, j := range p.pos {
			ks[i] = o.sp.keys[p.shard][j]
		}
	}
	req.Keys = api.KeysBytes(ks)
	return &req
}

// requestNow is part p's request with the shard's current epoch: a new
// message each call, since a hedged part is in two calls at once and gRPC
// marshals each request while the other call may be building its own.
// The keys are shared; nothing writes them.
func (o *pullOp) requestNow(p *part) *shardpb.PullRequest {
	r := o.reqs[p]
	return &shardpb.PullRequest{Table: r.Table, Shard: r.Shard, Keys: r.Keys, Consistency: r.Consistency,
		StalenessBoundNs: r.StalenessBoundNs, AllowWeaker: r.AllowWeaker, Epoch: o.c.epoch(o.table, p.shard)}
}

// place puts a part's answer where Pull reads it, if it is the part's
// first. It reports whether rows now point into values.
func (o *pullOp) place(p *part, addr string, values []byte) (aliased bool, err error) {
	n := len(o.sp.keys[p.shard])
	if p.pos != nil {
		n = len(p.pos)
	}
	if len(values) != n*o.rowBytes {
		return false, fmt.Errorf("raftps client: %s answered %d bytes for %d keys of %d bytes each", addr, len(values), n, o.rowBytes)
	}
	if !p.claim() {
		return false, nil
	}
	if p.pos == nil {
		o.rows[p.shard] = values
		return true, nil
	}
	for i, j := range p.pos {
		copy(o.rows[p.shard][j*o.rowBytes:(j+1)*o.rowBytes], values[i*o.rowBytes:(i+1)*o.rowBytes])
	}
	return false, nil
}

func (o *pullOp) batch(ctx context.Context, addr string, st shardpb.ParameterServerClient, parts []*part) ([]partResult, error) {
	req := &shardpb.PullBatchRequest{Parts: make([]*shardpb.PullRequest, len(parts))}
	for i, p := range parts {
		req.Parts[i] = o.requestNow(p)
	}
	// The answer's values stay in the message the codec received until the
	// pull has copied them out, unless no part was placed from it.
	codec := new(pullAnswer)
	placed := false
	defer func() { o.answers.keep(codec.msg, placed) }()
	resp, err := st.PullBatch(ctx, req, grpc.ForceCodecV2(codec))
	if err != nil {
		return nil, err
	}
	if err := checkAnswers(addr, len(parts), len(resp.Parts), len(resp.Errors)); err != nil {
		return nil, err
	}
	again := addr
	if o.spread {
		again = ""
	}
	res := make([]partResult, len(parts))
	for i, p := range parts {
		if res[i] = o.c.retryPart(resp.Errors[i], again); res[i].err == nil {
			aliased, err := o.place(p, addr, resp.Parts[i].Values)
			if err != nil {
				res[i] = partResult{err: err, retry: true, hint: again}
			}
			placed = placed || aliased
		}
	}
	return res, nil
}

func (o *pullOp) single(ctx context.Context, addr string, st shardpb.ParameterServerClient, p *part) error {
	req := o.requestNow(p)
	resp, err := st.Pull(ctx, req)
	if err != nil {
		return err
	}
	_, err = o.place(p, addr, resp.Values)
	return err
}

func (o *pullOp) failed([]*part) {}
