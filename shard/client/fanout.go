package client

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/raftps/raftps/shard/api"
	"github.com/raftps/raftps/shard/shardpb"
)

// split groups the distinct keys of a batch by shard.
type split struct {
	keys [][]uint64 // per shard, distinct, in order of first appearance
	pos  [][]int    // per shard: for each distinct key, its first batch position
	of   []int      // per batch position: index of its key within its shard's keys
	sh   []uint32   // per batch position: its shard
}

// splitScratch is splitKeys' hash table of first positions, kept between
// calls: a map of a batch's keys was a sixth of a pulling client's CPU
// (its buckets allocated and hashed anew for every call).
var splitScratch = sync.Pool{New: func() any { return new([]int32) }}

func splitKeys(keys []uint64, shards uint32) *split {
	n := len(keys)
	sp := &split{keys: make([][]uint64, shards), pos: make([][]int, shards), of: make([]int, n), sh: make([]uint32, n)}
	if n == 0 {
		return sp
	}
	// Open addressing, at most half full. The slot comes from the hash's
	// high bits: the shard is its low bits modulo shards, so one shard's
	// keys would crowd together in a table indexed by those.
	shift := 64 - bits.Len(uint(2*n-1))
	tp := splitScratch.Get().(*[]int32)
	defer splitScratch.Put(tp)
	if size := 1 << (64 - shift); cap(*tp) < size {
		*tp = make([]int32, size)
	} else {
		*tp = (*tp)[:size]
	}
	table, mask := *tp, uint64(len(*tp)-1)
	defer clear(table)
	counts := make([]int, shards)
	first := make([]bool, n)
	for i, k := range keys {
		h := api.Mix64(k)
		s := uint32(h % uint64(shards))
		sp.sh[i] = s
		for slot := h >> shift; ; slot = (slot + 1) & mask {
			e := table[slot]
			if e == 0 {
				table[slot] = int32(i + 1)
				sp.of[i] = counts[s]
				counts[s]++
				first[i] = true
				break
			}
			if keys[e-1] == k {
				sp.of[i] = sp.of[e-1]
				break
			}
		}
	}
	distinct := 0
	for _, c := range counts {
		distinct += c
	}
	allKeys, allPos := make([]uint64, distinct), make([]int, distinct)
	at := 0
	for s, c := range counts {
		if c > 0 {
			sp.keys[s], sp.pos[s] = allKeys[at:at+c:at+c], allPos[at:at+c:at+c]
			at += c
		}
	}
	for i, k := range keys {
		if first[i] {
			s, j := sp.sh[i], sp.of[i]
			sp.keys[s][j], sp.pos[s][j] = k, i
		}
	}
	return sp
}

// part is what one request carries: keys of one shard, for one node.
type part struct {
	shard uint32
	// pos are the places of its keys among the shard's distinct keys of the
	// split; nil when it carries all of them (the usual case).
	pos []int
	// addr is the node to ask first; "" sends the part straight to the
	// per-shard path, which asks the shard's replicas in turn. alts are
	// the other nodes that may serve it (a spread read's other candidates,
	// best first): where a hedge goes when addr is late.
	addr string
	alts []string

	// The part's resolution during its fan-out, guarded by mu: done once
	// an attempt's answer was placed (the first wins); inflight counts the
	// batch calls that carry it and have not answered; escalated once it
	// went to the per-shard path; calls are the batch calls carrying it;
	// err is how it ended (nil when answered), read once the fan-out ends.
	mu        sync.Mutex
	done      bool
	inflight  int
	escalated bool
	calls     []*batchCall
	err       error
}

// claim reports whether the caller's answer is the part's first: only that
// one is placed.
func (p *part) claim() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done {
		return false
	}
	p.done = true
	return true
}

// partResult is what a batch call said of one part: done (err nil), failed
// for good, or worth retrying on the per-shard path, starting at hint.
type partResult struct {
	err   error
	retry bool
	hint  string
}

// partOp is one kind of fan-out, a pull or a push: how its parts travel.
type partOp interface {
	// batch sends parts to the node at addr in one call and says what
	// became of each; an error fails the call as a whole. A part it
	// answers is placed only if p.claim() says so.
	batch(ctx context.Context, addr string, st shardpb.ParameterServerClient, parts []*part) ([]partResult, error)
	// single sends one part to the node at addr, for the per-shard path.
	single(ctx context.Context, addr string, st shardpb.ParameterServerClient, p *part) error
	// failed learns the parts of a batch call that failed as a whole.
	failed(parts []*part)
}

// batchCall is one batch call of a fan-out: cancelled once every part it
// carries is done elsewhere (a hedge won), so a late node is not waited for.
type batchCall struct {
	addr      string
	cancel    context.CancelFunc
	remaining atomic.Int32
}

// fan is one fan-out in progress.
type fan struct {
	c     *Client
	ctx   context.Context
	table string
	op    partOp
	parts []*part
	wg    sync.WaitGroup
}

// fanOut sends the parts of one pull or push: one batch call to each node
// some part names, so a batch costs a round trip per node rather than per
// shard, each bounded as an attempt is (AttemptTimeout, and the node's
// peers asked once it is late). A call of parts that other nodes may serve
// too (bounded and eventual reads, hot keys, chain reads) that is slower
// than the hedge threshold is hedged: its parts are sent to their next
// candidates as well, the first good answer of each wins, and the late
// call is cancelled once it carries nothing left (hedge.go). A part no call
// completed (the node no longer leads the shard, refused the read, did not
// answer) goes to the per-shard path, which retries it through leader
// changes and map moves. Every pull, at every level, and every push goes
// through here, so each gets the same handling of dead and slow nodes.
func (c *Client) fanOut(ctx context.Context, table string, parts []*part, op partOp) error {
	f := &fan{c: c, ctx: ctx, table: table, op: op, parts: parts}
	byNode := map[string][]*part{}
	for _, p := range parts {
		if p.addr == "" {
			f.escalate(p, "")
			continue
		}
		byNode[p.addr] = append(byNode[p.addr], p)
	}
	for addr, ps := range byNode {
		f.send(addr, ps, true)
	}
	f.wg.Wait()
	errs := make([]error, len(parts))
	for i, p := range parts {
		p.mu.Lock()
		errs[i] = p.err
		p.mu.Unlock()
	}
	return errors.Join(errs...)
}

// send makes one batch call of ps to addr; a primary call may be hedged.
func (f *fan) send(addr string, ps []*part, primary bool) {
	bctx, cancel := context.WithCancel(f.ctx)
	b := &batchCall{addr: addr, cancel: cancel}
	b.remaining.Store(int32(len(ps)))
	for _, p := range ps {
		p.mu.Lock()
		p.inflight++
		p.calls = append(p.calls, b)
		p.mu.Unlock()
	}
	hedgeable := primary && f.c.hedging() && slices.ContainsFunc(ps, func(p *part) bool { return len(p.alts) > 0 })
	if hedgeable {
		f.c.hedgeCredit()
	}
	f.wg.Go(func() {
		defer cancel()
		type answer struct {
			res []partResult
			err error
		}
		ch := make(chan answer, 1)
		start := time.Now()
		go func() {
			res, err := f.c.batchAttempt(bctx, addr, ps, f.op)
			ch <- answer{res, err}
		}()
		var a answer
		if hedgeable {
			t := time.NewTimer(f.c.hedgeAfter())
			select {
			case a = <-ch:
				t.Stop()
			case <-t.C:
				f.hedge(addr, ps)
				a = <-ch
			}
			if a.err == nil {
				f.c.noteLatency(time.Since(start))
			}
		} else {
			a = <-ch
		}
		if a.err != nil {
			f.op.failed(ps)
		}
		for i, p := range ps {
			switch {
			case a.err != nil:
				// Another node may know better; start from the list.
				f.ended(p, b, nil, true, "")
			default:
				f.ended(p, b, a.res[i].err, a.res[i].retry, a.res[i].hint)
			}
		}
	})
}

// hedge sends the parts of the late call to addr that are not answered yet
// to their next candidates, a call per node, as far as the hedge budget
// allows.
func (f *fan) hedge(addr string, ps []*part) {
	byNode := map[string][]*part{}
	var order []string
	for _, p := range ps {
		p.mu.Lock()
		open := !p.done && !p.escalated
		p.mu.Unlock()
		if !open {
			continue
		}
		for _, alt := range p.alts {
			if alt != addr && !f.c.isSilent(alt) {
				if byNode[alt] == nil {
					order = append(order, alt)
				}
				byNode[alt] = append(byNode[alt], p)
				break
			}
		}
	}
	for _, alt := range order {
		if !f.c.takeHedge() {
			return
		}
		f.send(alt, byNode[alt], false)
	}
}

// ended records how call b ended for part p: answered (err nil: its answer
// was placed, or another's had been), failed for good (err, no retry), or
// worth retrying on the per-shard path from hint. A part whose calls all
// ended without an answer goes to that path; a failure for good stands
// unless another call still answers.
func (f *fan) ended(p *part, b *batchCall, err error, retry bool, hint string) {
	p.mu.Lock()
	p.inflight--
	if err == nil && !retry {
		// The part is done (this call placed it, or an earlier one did).
		calls := p.calls
		p.calls = nil
		won := p.addr != b.addr
		p.err = nil
		p.mu.Unlock()
		if won {
			// A hedge beat the node first asked: ask it later for a while.
			f.c.markSlow(p.addr)
		}
		for _, o := range calls {
			if o.remaining.Add(-1) == 0 {
				o.cancel()
			}
		}
		return
	}
	if p.done || p.inflight > 0 || p.escalated {
		p.mu.Unlock()
		return
	}
	if !retry {
		p.err = err
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	f.escalate(p, hint)
}

// escalate sends a part no batch call completed to the per-shard path,
// once.
func (f *fan) escalate(p *part, hint string) {
	p.mu.Lock()
	if p.escalated || p.done {
		p.mu.Unlock()
		return
	}
	p.escalated = true
	p.mu.Unlock()
	f.wg.Go(func() {
		err := f.c.shardRetry(f.ctx, f.table, p.shard, hint, func(ctx context.Context, addr string) error {
			st, err := f.c.stub(addr)
			if err != nil {
				return err
			}
			return f.op.single(ctx, addr, st, p)
		})
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
	})
}

// batchAttempt is one batch call to one node, bounded as an attempt is.
func (c *Client) batchAttempt(ctx context.Context, addr string, parts []*part, op partOp) ([]partResult, error) {
	st, err := c.stub(addr)
	if err != nil {
		return nil, err
	}
	actx, cancel := c.attemptContext(ctx, addr)
	defer cancel()
	res, err := op.batch(actx, addr, st, parts)
	return res, c.callFailed(ctx, actx, addr, err)
}

// checkAnswers checks that a batch answer has a response and an error entry
// for each of its n parts.
func checkAnswers(addr string, n, responses, errs int) error {
	if responses != n || errs != n {
		return fmt.Errorf("raftps client: %s answered %d parts and %d errors for %d parts", addr, responses, errs, n)
	}
	return nil
}

// retryPart reads a batch answer's error for one part. Every failure is
// retried on the per-shard path, which gives up at once on one that is not
// retryable: an error costs one more call, and the rules stay in retry.
// The retry starts at the leader a refusal names, else at again (the node
// that answered, "" for none).
func (c *Client) retryPart(pe *shardpb.PartError, again string) partResult {
	if pe.GetCode() == 0 {
		return partResult{}
	}
	err := api.FromStatusProto(api.PartStatus(pe))
	hint := pe.GetInfo().GetLeaderAddr()
	if hint != "" {
		c.leaderNamed(hint)
	} else {
		hint = again
	}
	return partResult{err: err, retry: true, hint: hint}
}
