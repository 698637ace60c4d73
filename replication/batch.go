package replication

import (
	"context"
	"fmt"
	"slices"

	"github.com/raftps/raftps/store"
)

// BatcherConfig configures a Batcher.
type BatcherConfig struct {
	// Who names the replica in errors: "group t/0", "chain t/0".
	Who string
	// MaxEntryBytes caps one log entry; EntryPrefix of its bytes go before
	// the command (a chain entry's epoch; 0 for a Raft entry). A push too
	// large for an entry on its own is refused (Check); a batch takes
	// pushes up to what the entry holds.
	MaxEntryBytes, EntryPrefix int
	// MaxInflight bounds the batches taken and not yet answered.
	MaxInflight int
	// Closed is closed when the owner shuts down.
	Closed <-chan struct{}
}

// Batcher is the group commit that Raft groups and chain heads share.
// Callers queue pushes with Submit and wait for their outcome; the owner's
// one batcher goroutine takes them out with Next, as many as one log entry
// holds, and logs each Batch as one entry. A batch holds one of MaxInflight
// slots until it is answered (Answer, Fail): while the log is busy, the
// pushes that arrive wait together and go out as one entry.
//
// Concurrency: Check and Submit are safe for concurrent use. Next is called
// by one goroutine at a time; Drain once that goroutine has exited (the
// owner's Close).
type Batcher struct {
	cfg      BatcherConfig
	overhead int // bytes of an entry besides its pushes
	pushCh   chan *pending
	inflight chan struct{} // a token per batch taken and not answered
	carry    *pending      // taken by Next, for the next batch: it did not fit
}

// pending is a push waiting to be logged: its encoding, and where to answer.
type pending struct {
	enc  []byte
	done chan pushOutcome
}

// NewBatcher returns an empty Batcher.
func NewBatcher(cfg BatcherConfig) *Batcher {
	return &Batcher{
		cfg:      cfg,
		overhead: pushBatchHeaderMax + cfg.EntryPrefix,
		pushCh:   make(chan *pending, 4096),
		inflight: make(chan struct{}, cfg.MaxInflight),
	}
}

func (q *Batcher) closedErr() error { return fmt.Errorf("%s: %w", q.cfg.Who, ErrGroupClosed) }

// Check validates a push against table t, the one it will be applied to:
// client and seq non-zero, some keys, the table's dim and finite values, and
// a size one entry holds. Raft groups and chain heads check alike.
func (q *Batcher) Check(t *store.Table, p *Push) error {
	who := q.cfg.Who
	if p.Client == 0 || p.Seq == 0 {
		return fmt.Errorf("%s: %w: client ID and seq must be non-zero", who, ErrBadRequest)
	}
	if len(p.Keys) == 0 {
		return fmt.Errorf("%s: %w: push with no keys", who, ErrBadRequest)
	}
	if err := t.Check(p.Keys, p.Grads); err != nil {
		return fmt.Errorf("%s: %w", who, err)
	}
	if size := p.encodedSize() + q.overhead; size > q.cfg.MaxEntryBytes {
		return fmt.Errorf("%s: %w: push of %d keys is %d bytes, more than a log entry holds (%d)", who, ErrBadRequest, len(p.Keys), size, q.cfg.MaxEntryBytes)
	}
	return nil
}

// Submit queues p, encoded (the caller's slices are copied before it
// returns), and waits for its outcome: duplicate if its (client, seq) had
// been applied. Once queued, a push whose wait ends early (ctx, the owner's
// Close) has an unknown outcome (ErrUnknownOutcome): it may yet be logged.
func (q *Batcher) Submit(ctx context.Context, p *Push) (duplicate bool, err error) {
	who := q.cfg.Who
	pd := &pending{enc: appendPush(make([]byte, 0, p.encodedSize()), p), done: make(chan pushOutcome, 1)}
	select {
	case q.pushCh <- pd:
	case <-ctx.Done():
		return false, fmt.Errorf("%s: push not sent: %w", who, ctx.Err())
	case <-q.cfg.Closed:
		return false, q.closedErr()
	}
	select {
	case o := <-pd.done:
		return o.duplicate, o.err
	case <-ctx.Done():
		return false, fmt.Errorf("%s: %w: %w", who, ErrUnknownOutcome, ctx.Err())
	case <-q.cfg.Closed:
		return false, fmt.Errorf("%s: %w: %w", who, ErrUnknownOutcome, ErrGroupClosed)
	}
}

// Next returns the next batch. It waits for the next push (or takes the one
// the last batch left over), then for a free in-flight slot, so that while
// the log is busy the pushes that arrive wait together; then it drains
// whatever else is queued, as much as one entry holds, leaving the first
// push that does not fit for the next batch. ok is false once Closed is
// closed; a push already taken is then answered with ErrGroupClosed.
func (q *Batcher) Next() (b *Batch, ok bool) {
	limit := q.cfg.MaxEntryBytes - q.overhead
	first := q.carry
	q.carry = nil
	if first == nil {
		select {
		case first = <-q.pushCh:
		case <-q.cfg.Closed:
			return nil, false
		}
	}
	select {
	case q.inflight <- struct{}{}:
	case <-q.cfg.Closed:
		first.done <- pushOutcome{err: q.closedErr()}
		return nil, false
	}
	b = &Batch{q: q, pushes: []*pending{first}, size: len(first.enc)}
	for b.size < limit {
		select {
		case p := <-q.pushCh:
			if b.size+len(p.enc) > limit {
				q.carry = p
				return b, true
			}
			b.pushes = append(b.pushes, p)
			b.size += len(p.enc)
		default:
			return b, true
		}
	}
	return b, true
}

// Drain answers the pushes still queued with ErrGroupClosed. The owner
// calls it in Close, once Closed is closed and its batcher goroutine has
// exited.
func (q *Batcher) Drain() {
	for {
		select {
		case p := <-q.pushCh:
			p.done <- pushOutcome{err: q.closedErr()}
		default:
			return
		}
	}
}

// Batch is the pushes Next took for one log entry. Answer or Fail it
// exactly once: that answers every push and frees its in-flight slot.
type Batch struct {
	q      *Batcher
	pushes []*pending
	size   int // bytes of the pushes' encodings
}

// AppendCommand appends the push batch command of b, stamped with the
// leader's (or head's) clock leaderTime, to dst and returns it.
func (b *Batch) AppendCommand(dst []byte, leaderTime int64) []byte {
	dst = slices.Grow(dst, pushBatchHeaderMax+b.size)
	dst = appendPushBatchHeader(dst, leaderTime, len(b.pushes))
	for _, p := range b.pushes {
		dst = append(dst, p.enc...)
	}
	return dst
}

// Answer hands each push the outcome that applying b's entry gave it.
func (b *Batch) Answer(res *ApplyResult) {
	for i, p := range b.pushes {
		switch {
		case i < len(res.outcomes):
			p.done <- res.outcomes[i]
		case res.err != nil:
			p.done <- pushOutcome{err: res.err}
		default:
			p.done <- pushOutcome{err: fmt.Errorf("%s: no outcome for push %d of the entry", b.q.cfg.Who, i)}
		}
	}
	<-b.q.inflight
}

// Fail answers every push of b with err.
func (b *Batch) Fail(err error) {
	for _, p := range b.pushes {
		p.done <- pushOutcome{err: err}
	}
	<-b.q.inflight
}
