package replication

import (
	"context"
	"fmt"

	"github.com/raftps/raftps/store"
)

// nextBatch is the group commit that Raft groups and chain heads share. It
// waits for the next push (or takes *carry, left over from the last
// batch), then for a free in-flight slot, so that while the log is busy the
// pushes that arrive wait together; then it drains whatever else is queued,
// up to limit bytes of pushes, leaving the first that does not fit in
// *carry. ok is false once closed is closed; a push already taken is then
// answered with closedErr.
func nextBatch(pushCh <-chan *pending, inflight chan<- struct{}, closed <-chan struct{},
	closedErr func() error, limit int, carry **pending) (batch []*pending, size int, ok bool) {
	first := *carry
	*carry = nil
	if first == nil {
		select {
		case first = <-pushCh:
		case <-closed:
			return nil, 0, false
		}
	}
	select {
	case inflight <- struct{}{}:
	case <-closed:
		first.done <- pushOutcome{err: closedErr()}
		return nil, 0, false
	}
	batch = []*pending{first}
	size = len(first.enc)
	for size < limit {
		select {
		case p := <-pushCh:
			if size+len(p.enc) > limit {
				*carry = p
				return batch, size, true
			}
			batch = append(batch, p)
			size += len(p.enc)
		default:
			return batch, size, true
		}
	}
	return batch, size, true
}

// checkPush validates a push for a log entry of at most maxEntry bytes, of
// which overhead go to headers: client and seq non-zero, some keys, the
// table's dim and finite values, and a size one entry holds. who names the
// replica in errors ("group t/0", "chain t/0"). Raft groups and chain heads
// check alike.
func checkPush(who string, t *store.Table, p *Push, overhead, maxEntry int) error {
	if p.Client == 0 || p.Seq == 0 {
		return fmt.Errorf("%s: %w: client ID and seq must be non-zero", who, ErrBadRequest)
	}
	if len(p.Keys) == 0 {
		return fmt.Errorf("%s: %w: push with no keys", who, ErrBadRequest)
	}
	if err := t.Check(p.Keys, p.Grads); err != nil {
		return fmt.Errorf("%s: %w", who, err)
	}
	if size := p.encodedSize() + overhead; size > maxEntry {
		return fmt.Errorf("%s: %w: push of %d keys is %d bytes, more than a log entry holds (%d)", who, ErrBadRequest, len(p.Keys), size, maxEntry)
	}
	return nil
}

// submitPush hands p, encoded, to the batcher and waits for its outcome.
// Once queued, a push whose wait ends early (ctx, Close) has an unknown
// outcome: it may yet be logged.
func submitPush(ctx context.Context, who string, pushCh chan<- *pending, closed <-chan struct{}, closedErr func() error, p *Push) (duplicate bool, err error) {
	pd := &pending{enc: appendPush(make([]byte, 0, p.encodedSize()), p), done: make(chan pushOutcome, 1)}
	select {
	case pushCh <- pd:
	case <-ctx.Done():
		return false, fmt.Errorf("%s: push not sent: %w", who, ctx.Err())
	case <-closed:
		return false, closedErr()
	}
	select {
	case o := <-pd.done:
		return o.duplicate, o.err
	case <-ctx.Done():
		return false, fmt.Errorf("%s: %w: %w", who, ErrUnknownOutcome, ctx.Err())
	case <-closed:
		return false, fmt.Errorf("%s: %w: %w", who, ErrUnknownOutcome, ErrGroupClosed)
	}
}
