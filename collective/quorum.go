package collective

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"
)

// QuorumConfig describes one rank of a quorum run (see JoinQuorum).
//
// Of the embedded Config, a quorum run uses Rank, Addrs (its length is the
// number of ranks N; only Addrs[0], where rank 0 listens, is dialled, and
// the other entries may be empty), Job, Generation, Timeout, JoinTimeout and
// Listener (rank 0 only: other ranks do not listen and close it). ChunkBytes,
// SmallBytes and Algorithm are checked as for Join but not used.
type QuorumConfig struct {
	Config

	// Need is the number of contributions accepted per step, 1..N: with B
	// backup workers, N-B. Every rank must use the same value.
	Need int
	// Steps is the number of steps of the run (at least 1). After step
	// Steps completes, rank 0 releases step Steps+1 as the final release:
	// Next returns it (with the final state) and the caller stops. Every
	// rank must use the same value.
	Steps uint64
	// StepTimeout bounds how long a released step may wait for its Need
	// contributions before the run fails with ErrQuorumLost (fewer than
	// Need ranks are making progress). 0 means Timeout.
	StepTimeout time.Duration
	// Initial is the initial state (rank 0; copied). Other ranks may pass
	// nil, or a slice whose length (not contents) must match rank 0's.
	Initial []float32
	// Update is called on rank 0 only, once per step, from the coordinator's
	// goroutine, after the step's Need contributions were accepted and each
	// accepted rank called Done (or was dropped): sum is their element-wise
	// sum, added in increasing rank order, n is Need, and state (the state
	// released for step) is to be updated in place to give step+1's state.
	// Neither slice may be kept after Update returns.
	Update func(step uint64, sum []float32, n int, state []float32)
}

// maxQuorumLen is the longest state: a frame's payload length is a uint32
// byte count.
const maxQuorumLen = (1<<32 - 1) / 4

func (c QuorumConfig) withDefaults() (QuorumConfig, error) {
	// Only Addrs[0] is used, so the others may be left empty; Config's
	// check wants them set.
	addrs := append([]string(nil), c.Addrs...)
	for i := 1; i < len(addrs); i++ {
		if addrs[i] == "" {
			addrs[i] = "(unused)"
		}
	}
	base := c.Config
	base.Addrs = addrs
	base, err := base.withDefaults()
	if err != nil {
		return c, err
	}
	c.Config = base
	n := len(addrs)
	switch {
	case c.Need < 1 || c.Need > n:
		return c, fmt.Errorf("%w: Need (%d) is not in [1, %d]", ErrConfig, c.Need, n)
	case c.Steps == 0:
		return c, fmt.Errorf("%w: Steps is 0: a run has at least one step", ErrConfig)
	case c.Steps >= 1<<63:
		return c, fmt.Errorf("%w: Steps (%d) is too large", ErrConfig, c.Steps)
	case c.StepTimeout < 0:
		return c, fmt.Errorf("%w: StepTimeout (%s) is negative", ErrConfig, c.StepTimeout)
	case len(c.Initial) > maxQuorumLen:
		return c, fmt.Errorf("%w: Initial has %d elements, more than %d", ErrConfig, len(c.Initial), maxQuorumLen)
	case c.Rank == 0 && len(c.Initial) == 0:
		return c, fmt.Errorf("%w: rank 0 needs Initial, the state vector", ErrConfig)
	case c.Rank == 0 && c.Update == nil:
		return c, fmt.Errorf("%w: rank 0 needs Update", ErrConfig)
	}
	if c.StepTimeout == 0 {
		c.StepTimeout = c.Timeout
	}
	return c, nil
}

// Quorum is one rank's membership in a quorum run: synchronous steps that
// proceed with the first Need contributions and discard the late ones (SGD
// with backup workers). Create it with JoinQuorum. Rank 0 coordinates the run
// in its own goroutines and also takes part like any other rank.
//
// One call (Next, Submit, Done) at a time: a call started while another runs
// fails with ErrBusy. Close may be called at any time.
type Quorum struct {
	cfg    QuorumConfig
	length int

	// op allows one call at a time (TryLock) and guards the fields below.
	op        sync.Mutex
	last      uint64 // step the last Next returned
	final     bool   // last is the final release
	submitted uint64 // step of the last Submit for last, or 0
	accepted  bool   // that Submit was accepted
	doneSent  bool   // and Done was called for it

	qc *qconn // ranks > 0: the connection to rank 0
	co *coord // rank 0

	mu     sync.Mutex
	broken error
	closed bool
}

// Rank returns this process's rank.
func (q *Quorum) Rank() int { return q.cfg.Rank }

// Size returns the number of ranks N.
func (q *Quorum) Size() int { return len(q.cfg.Addrs) }

// Need returns the number of contributions each step takes.
func (q *Quorum) Need() int { return q.cfg.Need }

// Len returns the length of the state vector.
func (q *Quorum) Len() int { return q.length }

// Next blocks until a step newer than the last one this rank saw has been
// released, copies that step's state into state (length Len), and returns
// the step. The first call returns step 1 and the Initial state. A rank that
// fell behind gets the latest release, skipping the ones between. When the
// run is over Next returns Steps+1 with the final state; a later call fails
// with ErrFinished. A rank whose Submit was accepted must call Done first.
//
// On a rank other than 0, cancelling ctx in the middle of the exchange makes
// this rank leave the run (the connection is no longer in step). After an
// error, state's contents are unspecified.
func (q *Quorum) Next(ctx context.Context, state []float32) (uint64, error) {
	const op = "next"
	if err := q.begin(op); err != nil {
		return 0, err
	}
	defer q.op.Unlock()
	switch {
	case len(state) != q.length:
		return 0, q.badInput(op, "state has %d elements, the run's state has %d", len(state), q.length)
	case q.final:
		return 0, fmt.Errorf("collective: rank %d quorum %s: %w: step %d was the final release", q.cfg.Rank, op, ErrFinished, q.last)
	case q.accepted && !q.doneSent:
		return 0, q.badInput(op, "Done(%d) was not called after the accepted Submit", q.submitted)
	}
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("collective: rank %d quorum %s: %w", q.cfg.Rank, op, context.Cause(ctx))
	}
	var step uint64
	var final bool
	var err error
	if q.co != nil {
		step, final, err = q.localNext(ctx, state)
	} else {
		step, final, err = q.remoteNext(ctx, state)
	}
	if err != nil {
		return 0, err
	}
	q.last, q.final = step, final
	q.submitted, q.accepted, q.doneSent = 0, false, false
	return step, nil
}

// Submit offers this rank's contribution (length Len) to step, the step the
// last Next returned. It returns true if the contribution was among the
// first Need for that step; the rank must then call Done once the step's
// side effects are finished. It returns false if the step already had Need
// contributions or is no longer the open step: the rank just calls Next.
// The contribution is copied before Submit returns.
func (q *Quorum) Submit(ctx context.Context, step uint64, contrib []float32) (bool, error) {
	const op = "submit"
	if err := q.begin(op); err != nil {
		return false, err
	}
	defer q.op.Unlock()
	switch {
	case len(contrib) != q.length:
		return false, q.badInput(op, "contribution has %d elements, the run's state has %d", len(contrib), q.length)
	case step == 0 || step > q.last:
		return false, q.badInput(op, "step %d was never released to this rank (Next last returned %d)", step, q.last)
	case q.final && step == q.last:
		return false, fmt.Errorf("collective: rank %d quorum %s: %w: step %d is the final release, it takes no contributions", q.cfg.Rank, op, ErrFinished, step)
	case step < q.last:
		return false, nil // late by this rank's own knowledge
	case q.submitted == step:
		return false, q.badInput(op, "step %d was already submitted", step)
	}
	if err := ctx.Err(); err != nil {
		return false, fmt.Errorf("collective: rank %d quorum %s: %w", q.cfg.Rank, op, context.Cause(ctx))
	}
	var accepted bool
	var err error
	if q.co != nil {
		accepted, err = q.localSubmit(step, contrib)
	} else {
		accepted, err = q.remoteSubmit(ctx, step, contrib)
	}
	if err != nil {
		return false, err
	}
	q.submitted, q.accepted = step, accepted
	return accepted, nil
}

// Done tells the coordinator that this rank, whose Submit for step was
// accepted, has finished the step's side effects (for a trainer: pushing its
// sparse gradients). The next step is released only once every accepted rank
// called Done, so its reads see all accepted pushes. A rank that does not
// call Done within Timeout of its accepted Submit is dropped from the run
// (its contribution still counts).
func (q *Quorum) Done(ctx context.Context, step uint64) error {
	const op = "done"
	if err := q.begin(op); err != nil {
		return err
	}
	defer q.op.Unlock()
	switch {
	case !q.accepted || q.submitted != step || step == 0:
		return q.badInput(op, "step %d has no accepted Submit from this rank", step)
	case q.doneSent:
		return q.badInput(op, "Done(%d) was already called", step)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("collective: rank %d quorum %s: %w", q.cfg.Rank, op, context.Cause(ctx))
	}
	var err error
	if q.co != nil {
		err = q.localDone(step)
	} else {
		err = q.remoteDone(ctx, step)
	}
	if err != nil {
		return err
	}
	q.doneSent = true
	return nil
}

// Close leaves the run. On rank 0, once the final step was released, it
// waits (at most Timeout) for every live rank to fetch it, then closes;
// before the final release it ends the run for everyone. Close on rank 0
// returns an error naming the ranks that were still live but had not
// fetched the final release when it gave up. A call in progress fails with
// ErrClosed. Close is idempotent.
func (q *Quorum) Close() error {
	q.mu.Lock()
	already := q.closed
	q.closed = true
	q.mu.Unlock()
	if already {
		return nil
	}
	if q.qc != nil {
		q.qc.conn.Close()
		return nil
	}
	return q.co.close()
}

func (q *Quorum) isClosed() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.closed
}

// begin takes the call lock and checks that this rank is still in the run.
func (q *Quorum) begin(op string) error {
	if !q.op.TryLock() {
		return fmt.Errorf("collective: rank %d quorum %s: %w", q.cfg.Rank, op, ErrBusy)
	}
	q.mu.Lock()
	broken, closed := q.broken, q.closed
	q.mu.Unlock()
	if closed || broken != nil {
		q.op.Unlock()
		return q.brokenErr(op)
	}
	return nil
}

func (q *Quorum) badInput(op, format string, args ...any) error {
	return fmt.Errorf("collective: rank %d quorum %s: %w: %s", q.cfg.Rank, op, ErrConfig, fmt.Sprintf(format, args...))
}

// fail records why this rank is out of the run (the first cause wins),
// closes its connection, and returns the error for op.
func (q *Quorum) fail(op string, cause error) error {
	q.mu.Lock()
	if q.broken == nil {
		q.broken = cause
	}
	q.mu.Unlock()
	if q.qc != nil {
		q.qc.conn.Close()
	}
	return q.brokenErr(op)
}

func (q *Quorum) brokenErr(op string) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return fmt.Errorf("collective: rank %d quorum %s: %w", q.cfg.Rank, op, ErrClosed)
	}
	return &brokenError{rank: q.cfg.Rank, op: op, cause: q.broken}
}

// brokenError is every call's error once this rank is out of the run:
// errors.Is ErrGroupBroken, and the cause (a *PeerError, ErrQuorumLost, a
// context error, ...) is reachable with errors.Is and errors.As.
type brokenError struct {
	rank  int
	op    string
	cause error
}

func (e *brokenError) Error() string {
	cause := e.cause.Error()
	if pe, ok := e.cause.(*PeerError); ok && pe.Rank == e.rank {
		// Its own "collective: rank R op:" prefix would repeat ours.
		cause = strings.TrimPrefix(cause, fmt.Sprintf("collective: rank %d %s: ", pe.Rank, pe.Op))
	}
	return fmt.Sprintf("collective: rank %d quorum %s: %v (cause: %s)", e.rank, e.op, ErrGroupBroken, cause)
}

func (e *brokenError) Unwrap() []error { return []error{ErrGroupBroken, e.cause} }

// JoinQuorum joins a quorum run. Rank 0 listens on Addrs[0] (or uses
// Config.Listener), accepts every other rank, checks each with a handshake
// (same Job, Generation, N, Need, Steps and state length), and then starts
// the run; the other ranks dial Addrs[0] and return once rank 0 has started
// the run. Every rank must join within JoinTimeout, as for Join.
func JoinQuorum(ctx context.Context, cfg QuorumConfig) (*Quorum, error) {
	cfg, err := cfg.withDefaults()
	// Only rank 0 of a run of several ranks listens.
	ln := cfg.takeListener(err == nil && cfg.Rank == 0 && len(cfg.Addrs) > 1)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeoutCause(ctx, cfg.JoinTimeout, ErrJoinTimeout)
	defer cancel()
	q := &Quorum{cfg: cfg}
	if cfg.Rank != 0 {
		if err := q.dial(ctx); err != nil {
			return nil, err
		}
		return q, nil
	}
	q.length = len(cfg.Initial)
	conns, err := q.accept(ctx, ln)
	if err != nil {
		return nil, err
	}
	q.co = newCoord(&q.cfg, conns)
	q.co.start()
	return q, nil
}

// --- rank 0: the in-process path to the coordinator ----------------------

func (q *Quorum) localNext(ctx context.Context, state []float32) (uint64, bool, error) {
	c := q.co
	for {
		s, changed, err := c.fetch(0, q.last)
		if err != nil {
			return 0, false, q.fail("next", err)
		}
		if s != nil {
			copy(state, s.data)
			step, final := s.step, s.final
			c.unref(s) // s may be reused from here on
			return step, final, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return 0, false, fmt.Errorf("collective: rank 0 quorum next: %w", context.Cause(ctx))
		case <-c.stop:
			return 0, false, q.fail("next", errors.New("the coordinator stopped"))
		}
	}
}

func (q *Quorum) localSubmit(step uint64, contrib []float32) (bool, error) {
	slot, err := q.co.reserve(0, step)
	if err != nil {
		return false, q.fail("submit", err)
	}
	if slot == nil {
		return false, nil
	}
	copy(slot, contrib)
	q.co.filled(0)
	return true, nil
}

func (q *Quorum) localDone(step uint64) error {
	if err := q.co.done(0, step); err != nil {
		return q.fail("done", err)
	}
	return nil
}

// --- ranks > 0: requests to rank 0 ---------------------------------------

func (q *Quorum) remoteNext(ctx context.Context, state []float32) (uint64, bool, error) {
	last := q.last
	h, err := q.call(ctx, "next", qheader{typ: qNext, step: last}, nil, qRelease, state, func(h qheader) string {
		if h.step <= last || h.nbytes != uint32(4*q.length) {
			return fmt.Sprintf("released step %d with %d bytes, this rank last saw step %d and expects %d bytes", h.step, h.nbytes, last, 4*q.length)
		}
		return ""
	})
	if err != nil {
		return 0, false, err
	}
	final := h.flag&qFlagFinal != 0
	if final {
		// Tell rank 0 at once that the final release arrived, so that its
		// Close need not wait for this rank's Close. Nothing else follows on
		// this connection; an error here changes nothing for this rank.
		q.qc.write(context.Background(), time.Now().Add(q.abortWait()), qheader{typ: qBye, step: h.step}, nil, "")
	}
	return h.step, final, nil
}

func (q *Quorum) remoteSubmit(ctx context.Context, step uint64, contrib []float32) (bool, error) {
	h, err := q.call(ctx, "submit", qheader{typ: qSubmit, step: step}, contrib, qVerdict, nil, func(h qheader) string {
		if h.step != step || h.nbytes != 0 {
			return fmt.Sprintf("answered for step %d with %d bytes, this rank submitted step %d", h.step, h.nbytes, step)
		}
		return ""
	})
	if err != nil {
		return false, err
	}
	return h.flag&qFlagAccepted != 0, nil
}

func (q *Quorum) remoteDone(ctx context.Context, step uint64) error {
	_, err := q.call(ctx, "done", qheader{typ: qDone, step: step}, nil, qDoneAck, nil, func(h qheader) string {
		if h.step != step || h.nbytes != 0 {
			return fmt.Sprintf("acknowledged Done for step %d with %d bytes, this rank sent Done(%d)", h.step, h.nbytes, step)
		}
		return ""
	})
	return err
}

// call sends one request to rank 0 and reads frames until the answer of type
// want, skipping heartbeats. check vets the answer's header before its
// payload (if any) is read into dst. Any failure takes this rank out of the
// run: the request and its answer may be half sent, so the connection is no
// longer in step.
func (q *Quorum) call(ctx context.Context, op string, req qheader, payload []float32, want uint8, dst []float32, check func(qheader) string) (qheader, error) {
	qc := q.qc
	stop := watchConn(ctx, qc.conn)
	defer stop()
	if err := qc.write(ctx, q.deadline(ctx), req, payload, ""); err != nil {
		return qheader{}, q.ioFail(ctx, op, err, true)
	}
	for {
		h, err := qc.readHeader(ctx, q.deadline(ctx))
		if err != nil {
			return qheader{}, q.ioFail(ctx, op, err, false)
		}
		switch h.typ {
		case qPing:
			if h.nbytes == 0 {
				continue
			}
		case qAbort:
			text, err := qc.readText(ctx, q.deadline(ctx), h.nbytes)
			if err != nil {
				return qheader{}, q.ioFail(ctx, op, err, false)
			}
			return qheader{}, q.fail(op, abortCause(h.flag, text))
		case want:
			if why := check(h); why != "" {
				return qheader{}, q.fail(op, q.mismatch(op, why))
			}
			if dst != nil {
				if err := qc.readFloats(ctx, q.deadline(ctx), dst); err != nil {
					return qheader{}, q.ioFail(ctx, op, err, false)
				}
			}
			return h, nil
		}
		return qheader{}, q.fail(op, q.mismatch(op, fmt.Sprintf("sent a %s frame (%d bytes) while this rank waited for %s", qTypeName(h.typ), h.nbytes, qTypeName(want))))
	}
}

func (q *Quorum) mismatch(op, what string) error {
	return &PeerError{Rank: q.cfg.Rank, Op: "quorum " + op, Peer: 0, Kind: ErrMismatch, Err: errors.New("unexpected frame"), What: what}
}

// ioFail turns an I/O error with rank 0 into this rank's failure. After a
// failed write it looks for an abort frame rank 0 may have sent just before
// closing, whose reason says more than "connection reset".
func (q *Quorum) ioFail(ctx context.Context, op string, err error, writing bool) error {
	if ctx.Err() != nil {
		return q.fail(op, fmt.Errorf("%w (while waiting for coordinator rank 0)", context.Cause(ctx)))
	}
	if cd, ok := ctx.Deadline(); ok && errors.Is(err, os.ErrDeadlineExceeded) && !time.Now().Before(cd) {
		// The I/O deadline was ctx's, and it passed just before ctx's own
		// timer fired.
		return q.fail(op, fmt.Errorf("%w (while waiting for coordinator rank 0)", context.DeadlineExceeded))
	}
	if q.isClosed() {
		return q.brokenErr(op)
	}
	if writing {
		if cause := q.pendingAbort(); cause != nil {
			return q.fail(op, cause)
		}
	}
	return q.fail(op, &PeerError{Rank: q.cfg.Rank, Op: "quorum " + op, Peer: 0, Kind: ErrPeerFailed, Err: err, What: describeIOErr(err, q.cfg.Timeout)})
}

func (q *Quorum) pendingAbort() error {
	d := time.Now().Add(q.abortWait())
	for {
		h, err := q.qc.readHeader(context.Background(), d)
		if err != nil {
			return nil
		}
		switch h.typ {
		case qPing:
			continue
		case qAbort:
			if text, err := q.qc.readText(context.Background(), d, h.nbytes); err == nil {
				return abortCause(h.flag, text)
			}
		}
		return nil
	}
}

func (q *Quorum) deadline(ctx context.Context) time.Time { return ioDeadline(ctx, q.cfg.Timeout) }

// abortWait bounds best-effort writes (abort, bye) that must not hold up a
// failure or a Close.
func (q *Quorum) abortWait() time.Duration { return min(q.cfg.Timeout, time.Second) }
