package client

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/raftps/raftps/shard/api"
	"github.com/raftps/raftps/shard/shardpb"
	"github.com/raftps/raftps/store"
)

// Push sends gradients (len(keys) × dim values, row i for keys[i]) to the
// table; the nodes' optimizer applies them. Gradients of a key that occurs
// more than once are summed first. Each shard's part is applied exactly
// once, however often it is retried; Push returns once every part is
// applied. On an error some parts may have been applied, each whole. A
// push larger than Config.MaxCallBytes goes as several calls.
func (c *Client) Push(ctx context.Context, table string, keys []uint64, grads []float32) (err error) {
	defer func(start time.Time) { c.metrics.observe("push", table, len(keys), start, err) }(time.Now())
	spec, err := c.spec(ctx, table)
	if err != nil {
		return err
	}
	dim := int(spec.Dim)
	if len(grads) != len(keys)*dim {
		return fmt.Errorf("raftps client: push of %d keys to table %q (dim %d) with %d values: %w", len(keys), table, dim, len(grads), ErrDimMismatch)
	}
	rows := c.rowsPerCall(dim)
	if len(keys) <= rows {
		return c.push(ctx, table, spec, keys, grads)
	}
	// Too large for one call: duplicates summed over the whole push first
	// (as one call would), then the distinct rows in calls of rows each.
	keys, grads = sumDuplicates(keys, grads, dim)
	for i := 0; i < len(keys); i += rows {
		j := min(i+rows, len(keys))
		if err := c.push(ctx, table, spec, keys[i:j], grads[i*dim:j*dim]); err != nil {
			return fmt.Errorf("rows %d..%d of %d (each call of at most %d rows; the earlier ones are applied): %w", i, j-1, len(keys), rows, err)
		}
	}
	return nil
}

// rowsPerCall is how many rows of a dim-wide table one call may carry
// (MaxCallBytes), at least one.
func (c *Client) rowsPerCall(dim int) int {
	return max(1, c.cfg.MaxCallBytes/(8+4*dim))
}

// sumDuplicates returns the distinct keys in their first order and each
// one's gradients summed, in that order.
func sumDuplicates(keys []uint64, grads []float32, dim int) ([]uint64, []float32) {
	at := make(map[uint64]int, len(keys))
	uk := make([]uint64, 0, len(keys))
	ug := make([]float32, 0, len(grads))
	for i, k := range keys {
		j, seen := at[k]
		if !seen {
			at[k] = len(uk)
			uk = append(uk, k)
			ug = append(ug, grads[i*dim:(i+1)*dim]...)
			continue
		}
		dst := ug[j*dim : (j+1)*dim]
		for col, v := range grads[i*dim : (i+1)*dim] {
			dst[col] += v
		}
	}
	return uk, ug
}

// push sends one call's worth of Push.
func (c *Client) push(ctx context.Context, table string, spec *shardpb.TableSpec, keys []uint64, grads []float32) error {
	dim := int(spec.Dim)
	sp := splitKeys(keys, spec.Shards)
	sums := make([][]float32, spec.Shards)
	for s := range sums {
		sums[s] = make([]float32, len(sp.keys[s])*dim)
	}
	for i := range keys {
		s, j := sp.sh[i], sp.of[i]
		dst, src := sums[s][j*dim:(j+1)*dim], grads[i*dim:(i+1)*dim]
		for col := range dst {
			dst[col] += src[col]
		}
	}
	bf16 := api.IsBF16(spec)
	op := &pushOp{c: c, table: table, reqs: make([]*shardpb.PushRequest, spec.Shards), sent: make([]bool, spec.Shards)}
	var parts []*part
	for s := range sp.keys {
		if len(sp.keys[s]) == 0 {
			continue
		}
		parts = append(parts, &part{shard: uint32(s), addr: c.leaderOf(table, uint32(s))})
		// Every attempt at a shard, batched or not, sends this request, so
		// a retry carries the same seq and is applied at most once.
		op.reqs[s] = &shardpb.PushRequest{Table: table, Shard: uint32(s), ClientId: c.cfg.ClientID,
			Seq: c.nextSeq(api.GroupID(table, uint32(s))), Keys: api.KeysBytes(sp.keys[s])}
		if bf16 {
			// Rounded once, here, after the duplicates' sum: the nodes
			// widen these bits exactly.
			op.reqs[s].Grads, op.reqs[s].GradsBf16 = store.AppendBF16(make([]byte, 0, len(sums[s])*store.BF16Bytes), sums[s]), true
		} else {
			op.reqs[s].Grads = api.ValuesBytes(sums[s])
		}
	}
	if err := c.fanOut(ctx, table, parts, op); err != nil {
		return fmt.Errorf("push to table %q: %w", table, err)
	}
	return nil
}

// leaderOf is the node a write to the shard goes to first: its known
// leader, else its preferred leader by the map; "" (the per-shard path) if
// neither is known or that node did not answer lately.
func (c *Client) leaderOf(table string, shard uint32) string {
	addr := c.leader(api.GroupID(table, shard))
	if addr == "" {
		if r := c.replicaAddrs(table, shard); len(r) > 0 {
			addr = r[0]
		}
	}
	if addr == "" || c.isSilent(addr) {
		return ""
	}
	return addr
}

// pushOp is the fan-out of one push: one part per shard.
type pushOp struct {
	c     *Client
	table string
	reqs  []*shardpb.PushRequest // by shard
	// sent[s]: an earlier attempt may have reached a leader's log. Only a
	// NotLeader refusal proves it did not; until one may have, the seq is
	// new to the cluster, and "duplicate" means another Client uses this
	// ClientID. Each shard's entry is used by one goroutine at a time.
	sent []bool
}

func (o *pushOp) duplicate(addr string, s uint32, dup bool) error {
	if dup && !o.sent[s] {
		req := o.reqs[s]
		return fmt.Errorf("%w: %s answered that push seq %d of client %d was applied before, but this Client never sent it: another Client uses ClientID %d", ErrClientIDReused, addr, req.Seq, req.ClientId, req.ClientId)
	}
	return nil
}

// notSent reports whether err proves that the push did not reach a log.
func notSent(err error) bool { return errors.Is(err, api.ErrNotLeader) || stale(err) }

func (o *pushOp) batch(ctx context.Context, addr string, st shardpb.ParameterServerClient, parts []*part) ([]partResult, error) {
	req := &shardpb.PushBatchRequest{Parts: make([]*shardpb.PushRequest, len(parts))}
	for i, p := range parts {
		o.reqs[p.shard].Epoch = o.c.epoch(o.table, p.shard)
		req.Parts[i] = o.reqs[p.shard]
	}
	resp, err := st.PushBatch(ctx, req)
	if err != nil {
		return nil, err
	}
	if err := checkAnswers(addr, len(parts), len(resp.Parts), len(resp.Errors)); err != nil {
		return nil, err
	}
	res := make([]partResult, len(parts))
	for i, p := range parts {
		res[i] = o.c.retryPart(resp.Errors[i], addr)
		if res[i].err == nil {
			if err := o.duplicate(addr, p.shard, resp.Parts[i].Duplicate); err != nil {
				res[i] = partResult{err: err}
			}
		}
		if res[i].err == nil || !notSent(res[i].err) {
			o.sent[p.shard] = true
		}
	}
	return res, nil
}

func (o *pushOp) single(ctx context.Context, addr string, st shardpb.ParameterServerClient, p *part) error {
	req := o.reqs[p.shard]
	req.Epoch = o.c.epoch(o.table, p.shard)
	resp, err := st.Push(ctx, req)
	if err != nil {
		if !notSent(api.FromStatus(err)) {
			o.sent[p.shard] = true
		}
		return err
	}
	return o.duplicate(addr, p.shard, resp.Duplicate)
}

// A batch call that failed as a whole may have reached the node.
func (o *pushOp) failed(parts []*part) {
	for _, p := range parts {
		o.sent[p.shard] = true
	}
}
