package collective

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
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

// watchConn makes ctx's cancellation interrupt blocked I/O on conn by moving
// its deadline to now. The reads and writes check ctx after arming their own
// deadline, so a cancellation is never lost to a deadline armed just after
// it. The returned func stops the watch, waiting for it if it already fired.
func watchConn(ctx context.Context, conn net.Conn) func() {
	if ctx.Done() == nil {
		return func() {}
	}
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(fired)
		conn.SetDeadline(time.Now())
	})
	return func() {
		if !stop() {
			<-fired
		}
	}
}

// abortCause is the error a rank reports when rank 0 ends its part in the
// run with an abort frame.
func abortCause(code uint8, text string) error {
	switch code {
	case abortLost:
		return fmt.Errorf("coordinator rank 0 ended the run: %w: %s", ErrQuorumLost, text)
	case abortDropped:
		return fmt.Errorf("coordinator rank 0 dropped this rank: %s", text)
	case abortProtocol:
		return fmt.Errorf("coordinator rank 0 dropped this rank: %w: %s", ErrMismatch, text)
	case abortJoin:
		return fmt.Errorf("%w: coordinator rank 0 gave up: %s", ErrJoinTimeout, text)
	}
	return fmt.Errorf("coordinator rank 0 ended the run: %s", text)
}

func describeIOErr(err error, timeout time.Duration) string {
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		return fmt.Sprintf("did not answer within %s", timeout)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "closed the connection"
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return "reset the connection"
	case errors.Is(err, net.ErrClosed):
		return "was cut off (this rank closed the connection)"
	}
	return "failed"
}

// --- frames ---------------------------------------------------------------

// Frame header (16 bytes, little-endian):
//
//	0  uint8  type
//	1  uint8  flag     release: 1 final; verdict: 1 accepted; abort: code
//	2  uint16 0
//	4  uint32 nbytes   payload length
//	8  uint64 step
const qHeaderLen = 16

// Frame types. A rank sends qNext (step: the last step it saw), qSubmit
// (payload: the contribution), qDone and qBye; rank 0 sends qStart once
// everyone joined, qRelease (payload: the state), qVerdict, qDoneAck, qPing
// while a Next waits, and qAbort (payload: the reason) before it closes.
const (
	qNext = 1 + iota
	qSubmit
	qDone
	qBye
	qStart
	qRelease
	qVerdict
	qDoneAck
	qPing
	qAbort
)

var qTypeNames = [...]string{qNext: "next", qSubmit: "submit", qDone: "done", qBye: "bye", qStart: "start",
	qRelease: "release", qVerdict: "verdict", qDoneAck: "done-ack", qPing: "ping", qAbort: "abort"}

func qTypeName(t uint8) string {
	if int(t) < len(qTypeNames) && qTypeNames[t] != "" {
		return qTypeNames[t]
	}
	return fmt.Sprintf("unknown (%d)", t)
}

const (
	qFlagFinal    = 1
	qFlagAccepted = 1
)

// Abort codes, in the flag of an abort frame.
const (
	abortClosed = 1 + iota
	abortLost
	abortDropped
	abortProtocol
	abortJoin
)

type qheader struct {
	typ, flag uint8
	nbytes    uint32
	step      uint64
}

// qconn is one end of a rank's connection to rank 0. At rank 0 one
// goroutine writes and another reads; at the other ranks one call at a time
// does both. wbuf and enc belong to the writer, rbuf and dec to the reader.
type qconn struct {
	conn net.Conn
	wbuf [qHeaderLen + smallWrite]byte
	rbuf [qHeaderLen]byte
	enc  []byte // big-endian hosts only
	dec  []byte // big-endian hosts only
}

// arm sets the deadline of the next reads or writes and then checks ctx
// (Background at rank 0's coordinator), so that a cancellation that moved
// the deadline to now just before is not undone.
func arm(ctx context.Context, set func(time.Time) error, d time.Time) error {
	if err := set(d); err != nil {
		return err
	}
	return ctx.Err()
}

// write sends one frame whose payload is f or text (at most one is set).
func (c *qconn) write(ctx context.Context, d time.Time, h qheader, f []float32, text string) error {
	if err := arm(ctx, c.conn.SetWriteDeadline, d); err != nil {
		return err
	}
	var payload []byte
	switch {
	case text != "":
		payload = []byte(text)
	case nativeLE:
		payload = floatBytes(f)
	default:
		if cap(c.enc) < 4*len(f) {
			c.enc = make([]byte, 4*len(f))
		}
		payload = c.enc[:4*len(f)]
		for i, v := range f {
			binary.LittleEndian.PutUint32(payload[4*i:], math.Float32bits(v))
		}
	}
	b := c.wbuf[:]
	b[0], b[1] = h.typ, h.flag
	binary.LittleEndian.PutUint16(b[2:], 0)
	binary.LittleEndian.PutUint32(b[4:], uint32(len(payload)))
	binary.LittleEndian.PutUint64(b[8:], h.step)
	var err error
	if len(payload) <= smallWrite {
		n := copy(b[qHeaderLen:], payload)
		_, err = c.conn.Write(b[:qHeaderLen+n])
	} else {
		bufs := net.Buffers{b[:qHeaderLen], payload}
		_, err = bufs.WriteTo(c.conn)
	}
	return err
}

// readHeader reads one frame header; a zero d means no deadline.
func (c *qconn) readHeader(ctx context.Context, d time.Time) (qheader, error) {
	if err := arm(ctx, c.conn.SetReadDeadline, d); err != nil {
		return qheader{}, err
	}
	if _, err := io.ReadFull(c.conn, c.rbuf[:]); err != nil {
		return qheader{}, err
	}
	b := c.rbuf[:]
	return qheader{typ: b[0], flag: b[1], nbytes: binary.LittleEndian.Uint32(b[4:]), step: binary.LittleEndian.Uint64(b[8:])}, nil
}

// readFloats reads a payload of exactly len(dst) float32s into dst.
func (c *qconn) readFloats(ctx context.Context, d time.Time, dst []float32) error {
	if err := arm(ctx, c.conn.SetReadDeadline, d); err != nil {
		return err
	}
	if nativeLE {
		_, err := io.ReadFull(c.conn, floatBytes(dst))
		return err
	}
	if cap(c.dec) < 4*len(dst) {
		c.dec = make([]byte, 4*len(dst))
	}
	b := c.dec[:4*len(dst)]
	if _, err := io.ReadFull(c.conn, b); err != nil {
		return err
	}
	for i := range dst {
		dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return nil
}

func (c *qconn) readText(ctx context.Context, d time.Time, n uint32) (string, error) {
	if n > maxReason {
		return "", fmt.Errorf("reason of %d bytes, more than %d", n, maxReason)
	}
	if err := arm(ctx, c.conn.SetReadDeadline, d); err != nil {
		return "", err
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(c.conn, b); err != nil {
		return "", err
	}
	return string(b), nil
}

// discard skips a payload of n bytes (a late contribution).
func (c *qconn) discard(d time.Time, n uint32) error {
	if err := c.conn.SetReadDeadline(d); err != nil {
		return err
	}
	_, err := io.CopyN(io.Discard, c.conn, int64(n))
	return err
}

// --- handshake ------------------------------------------------------------

// quorumHello is JoinQuorum's hello (see handshake.go), 56 bytes, then Job
// and the reason:
//
//	0  [4]byte "RPSQ"
//	4  uint16  version (1)
//	6  uint16  status: 0 hello / accepted, 1 refused
//	8  uint32  N
//	12 uint32  sender's rank
//	16 uint32  Need
//	20 uint32  0
//	24 uint64  Generation
//	32 uint64  Steps
//	40 uint64  state length (a rank: 0 if it does not know; rank 0: len(Initial))
//	48 uint16  len(Job)
//	50 uint16  len(reason)
//	52 uint32  0
var quorumHello = helloKind{
	name: "quorum", magic: [4]byte{'R', 'P', 'S', 'Q'}, length: 56, lens: 48,
	put: func(b []byte, h *hello) {
		le := binary.LittleEndian
		le.PutUint32(b[16:], h.need)
		le.PutUint64(b[32:], h.steps)
		le.PutUint64(b[40:], h.length)
	},
	get: func(b []byte, h *hello) {
		le := binary.LittleEndian
		h.need, h.steps, h.length = le.Uint32(b[16:]), le.Uint64(b[32:]), le.Uint64(b[40:])
	},
}

// quorumHandshake is the handshake of a rank of a quorum run with settings
// c. Rank 0 announces the length of its Initial; another rank its own
// expectation, 0 if it passed no Initial.
func quorumHandshake(c *QuorumConfig) *handshake {
	length := len(c.Initial)
	return &handshake{
		kind: &quorumHello, cfg: &c.Config, op: "join quorum", noun: "run",
		fill: func(h *hello, _ int) {
			h.need, h.steps, h.length = uint32(c.Need), c.Steps, uint64(length)
		},
		check: func(h *hello, _ int) string {
			switch {
			case int(h.size) != len(c.Addrs):
				return fmt.Sprintf("%d ranks, this run has %d", h.size, len(c.Addrs))
			case c.Rank == 0 && (h.from == 0 || int(h.from) >= len(c.Addrs)):
				return fmt.Sprintf("rank %d is not a rank that dials rank 0", h.from)
			case c.Rank != 0 && h.from != 0:
				return fmt.Sprintf("answers as rank %d, expected rank 0", h.from)
			case int(h.need) != c.Need:
				return fmt.Sprintf("Need %d, this rank uses %d", h.need, c.Need)
			case h.steps != c.Steps:
				return fmt.Sprintf("Steps %d, this rank uses %d", h.steps, c.Steps)
			case c.Rank == 0 && h.length != 0 && h.length != uint64(length):
				return fmt.Sprintf("expects a state of %d elements, rank 0's Initial has %d", h.length, length)
			case c.Rank != 0 && (h.length == 0 || h.length > maxQuorumLen):
				return fmt.Sprintf("announces a state of %d elements", h.length)
			case c.Rank != 0 && length != 0 && h.length != uint64(length):
				return fmt.Sprintf("has a state of %d elements, this rank's Initial has %d", h.length, length)
			}
			return ""
		},
	}
}

// --- JoinQuorum -----------------------------------------------------------

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

// dial connects a rank > 0 to rank 0 and waits for the start.
func (q *Quorum) dial(ctx context.Context) error {
	hs := quorumHandshake(&q.cfg)
	var notes notes
	c, h, err := hs.dial(ctx, 0, notes.add)
	if err != nil {
		return err
	}
	if c == nil {
		_, err := joinErr(ctx, hs, "no handshake with rank 0", notes.get())
		return err
	}
	q.qc = &qconn{conn: c}
	q.length = int(h.length)
	return q.awaitStart(ctx, hs)
}

// awaitStart waits, within the join's deadline, for rank 0 to start the run
// once every rank has joined.
func (q *Quorum) awaitStart(ctx context.Context, hs *handshake) error {
	qc := q.qc
	d, _ := ctx.Deadline() // JoinQuorum always sets one
	stop := watchConn(ctx, qc.conn)
	defer stop()
	fail := func(cause error) error {
		qc.conn.Close()
		return fmt.Errorf("collective: join quorum rank %d: %w", q.cfg.Rank, cause)
	}
	h, err := qc.readHeader(ctx, d)
	if err == nil && h.typ == qAbort {
		text, err := qc.readText(ctx, d, h.nbytes)
		if err == nil {
			return fail(abortCause(h.flag, text))
		}
	}
	if err != nil {
		if ctx.Err() != nil {
			qc.conn.Close()
			_, err := joinErr(ctx, hs, "no handshake with rank 0", []string{"connected, but rank 0 did not start the run"})
			return err
		}
		return fail(&PeerError{Rank: q.cfg.Rank, Op: "join quorum", Peer: 0, Kind: ErrPeerFailed, Err: err, What: describeIOErr(err, q.cfg.Timeout)})
	}
	if h.typ != qStart || h.nbytes != 0 {
		return fail(q.mismatch("join", fmt.Sprintf("sent a %s frame instead of start", qTypeName(h.typ))))
	}
	if err := qc.conn.SetDeadline(time.Time{}); err != nil {
		return fail(err)
	}
	return nil
}

// accept is rank 0's side of the join: it returns the connection of every
// other rank, indexed by rank, after writing the start frame to each. If
// the join fails, the ranks that joined get an abort frame saying why.
func (q *Quorum) accept(ctx context.Context, ln net.Listener) ([]*qconn, error) {
	cfg := &q.cfg
	conns := make([]*qconn, len(cfg.Addrs))
	if len(conns) == 1 {
		return conns, nil
	}
	hs := quorumHandshake(cfg)
	ln, err := hs.listen(ln)
	if err != nil {
		return nil, err
	}
	j := newJoiner(ctx, hs, ln)
	j.accept()
	joined, gist, fatal := j.wait()
	j.stop()
	for r, c := range joined {
		if c != nil {
			conns[r] = &qconn{conn: c}
		}
	}
	// Deadline for the start frame (or the abort): the join's own
	// deadline may be over already.
	d := time.Now().Add(q.abortWait())
	if fatal == nil {
		d = time.Now().Add(cfg.Timeout)
		for r, c := range conns {
			if c == nil {
				continue
			}
			if err := c.write(context.Background(), d, qheader{typ: qStart}, nil, ""); err != nil {
				fatal = &PeerError{Rank: 0, Op: "join quorum", Peer: r, Kind: ErrPeerFailed, Err: err, What: describeIOErr(err, cfg.Timeout)}
				gist = fmt.Sprintf("rank %d failed as the run started", r)
				break
			}
		}
	}
	if fatal != nil {
		for _, c := range conns {
			if c != nil {
				c.write(context.Background(), d, qheader{typ: qAbort, flag: abortJoin}, nil, gist)
				c.conn.Close()
			}
		}
		return nil, fatal
	}
	for _, c := range conns {
		if c != nil {
			c.conn.SetDeadline(time.Time{})
		}
	}
	return conns, nil
}

// --- the coordinator (rank 0) ---------------------------------------------

type rankStatus uint8

const (
	rankLive     rankStatus = iota
	rankDead                // failed, dropped or left before the final release
	rankFinished            // fetched the final release
)

// Where a rank stands in the open step.
type accState uint8

const (
	accNone     accState = iota
	accReserved          // accepted; the contribution is still arriving
	accFilled            // contribution in its slot; Done owed
	accDone
)

type rankState struct {
	status    rankStatus
	acc       accState
	submitted uint64 // the last step it submitted
	slot      []float32
	due       time.Time // when Done is owed by
	why       error     // why it is dead

	// Ranks > 0 only.
	qc       *qconn
	req      chan qheader  // reader to writer: a Next to serve or a reply to send
	kill     chan struct{} // closed when the rank leaves the run
	killCode uint8         // abort frame to send before closing, if not 0
	killWhy  string
}

// snapshot is one released state. Senders hold a reference while they copy
// or send it, so the coordinator never updates a buffer being read.
type snapshot struct {
	step  uint64
	final bool
	data  []float32
	refs  int
}

// coord runs the steps on rank 0: a loop goroutine that completes steps
// (calls Update, releases the next step) and enforces the timeouts, and for
// each other rank a reader goroutine (requests) and a writer goroutine
// (replies, releases, heartbeats, abort).
type coord struct {
	cfg    *QuorumConfig
	n      int
	length int

	mu      sync.Mutex
	cur     *snapshot
	spare   []*snapshot
	slots   [][]float32   // free contribution buffers (at most Need exist)
	sums    [][]float32   // the loop's scratch: accepted slots in rank order
	changed chan struct{} // closed (and replaced) when anything changes
	failed  chan struct{} // closed when the run fails
	err     error         // why the run failed
	code    uint8         // abort code for err
	opened  time.Time     // when the open step was released
	nAcc    int           // ranks accepted (reserved, filled or done) in the open step
	live    int
	loss    error // why the last rank died
	ranks   []rankState

	kick     chan struct{}
	stop     chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup
}

func newCoord(cfg *QuorumConfig, conns []*qconn) *coord {
	n := len(cfg.Addrs)
	c := &coord{
		cfg: cfg, n: n, length: len(cfg.Initial),
		cur:     &snapshot{step: 1, data: append([]float32(nil), cfg.Initial...)},
		changed: make(chan struct{}),
		failed:  make(chan struct{}),
		ranks:   make([]rankState, n),
		live:    n,
		kick:    make(chan struct{}, 1),
		stop:    make(chan struct{}),
		opened:  time.Now(),
	}
	for r := 1; r < n; r++ {
		st := &c.ranks[r]
		st.qc = conns[r]
		st.req = make(chan qheader, 1)
		st.kill = make(chan struct{})
	}
	return c
}

func (c *coord) start() {
	c.wg.Add(1 + 2*(c.n-1))
	go c.loop()
	for r := 1; r < c.n; r++ {
		go c.reader(r)
		go c.writer(r)
	}
}

func (c *coord) notifyLocked() {
	close(c.changed)
	c.changed = make(chan struct{})
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// failLocked ends the run: every live rank gets an abort frame with err.
func (c *coord) failLocked(code uint8, err error) {
	if c.err != nil {
		return
	}
	c.err, c.code = err, code
	close(c.failed)
	c.notifyLocked()
}

// wireReason is err's text as sent to the ranks, without the sentinel its
// abort code stands for.
func (c *coord) wireReason() string {
	s := c.err.Error()
	switch c.code {
	case abortLost:
		s = strings.TrimPrefix(s, ErrQuorumLost.Error()+": ")
	case abortClosed:
		s = strings.TrimPrefix(s, ErrClosed.Error()+": ")
	}
	return s
}

// leaveLocked takes rank r out of the run. A contribution it had fully
// delivered still counts; one still arriving is dropped.
func (c *coord) leaveLocked(r int, status rankStatus, why error, code uint8) {
	st := &c.ranks[r]
	if st.status != rankLive {
		return
	}
	st.status, st.why = status, why
	c.live--
	if status == rankDead {
		c.loss = why
	}
	if st.acc == accReserved {
		// Its reader may still be writing into the slot: leave the slot to
		// the garbage collector rather than to the next contribution.
		st.acc, st.slot = accNone, nil
		c.nAcc--
	}
	if st.kill != nil {
		if code != 0 {
			st.killCode, st.killWhy = code, why.Error()
			if code == abortProtocol { // the rank adds the sentinel back
				st.killWhy = strings.Replace(st.killWhy, ErrMismatch.Error()+": ", "", 1)
			}
		}
		close(st.kill)
	}
	c.notifyLocked()
}

func (c *coord) lost(r int, err error) {
	select {
	case <-c.stop:
		// Torn down: the writers close the connections, so a reader's
		// error now is this rank's own doing. Leaving here could fail the
		// run (quorum lost) and make the writers still running send that
		// abort, where the other ranks must see rank 0 go silent.
		return
	default:
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.leaveLocked(r, rankDead, err, 0)
}

func (c *coord) violation(r int, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.leaveLocked(r, rankDead, fmt.Errorf("rank %d: %w", r, err), abortProtocol)
}

// usableLocked says why rank r can no longer take part, or nil.
func (c *coord) usableLocked(r int) error {
	if c.err != nil {
		return c.err
	}
	st := &c.ranks[r]
	switch st.status {
	case rankDead:
		return st.why
	case rankFinished:
		return fmt.Errorf("rank %d already fetched the final release", r)
	}
	return nil
}

// fetch returns, with a reference, the latest release if it is newer than
// last; otherwise a channel closed at the next change.
func (c *coord) fetch(r int, last uint64) (*snapshot, <-chan struct{}, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.usableLocked(r); err != nil {
		return nil, nil, err
	}
	if s := c.cur; s.step > last {
		s.refs++
		return s, nil, nil
	}
	return nil, c.changed, nil
}

func (c *coord) unref(s *snapshot) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s.refs--
	if s.refs == 0 && s != c.cur {
		c.spare = append(c.spare, s)
	}
}

// reserve handles a Submit for step from rank r: it returns the slot to copy
// the contribution into if accepted, nil if rejected (late or full), or an
// error: the run failed, r is out, or (wrapping ErrMismatch) r broke the
// protocol.
func (c *coord) reserve(r int, step uint64) ([]float32, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.usableLocked(r); err != nil {
		return nil, err
	}
	st := &c.ranks[r]
	switch {
	case step == 0 || step > c.cur.step:
		return nil, fmt.Errorf("%w: submitted step %d, which was never released (latest: %d)", ErrMismatch, step, c.cur.step)
	case step <= st.submitted:
		return nil, fmt.Errorf("%w: submitted step %d after step %d", ErrMismatch, step, st.submitted)
	}
	st.submitted = step
	if step < c.cur.step || c.cur.final || c.nAcc == c.cfg.Need {
		return nil, nil
	}
	var slot []float32
	if k := len(c.slots); k > 0 {
		slot, c.slots = c.slots[k-1], c.slots[:k-1]
	} else {
		slot = make([]float32, c.length)
	}
	st.acc, st.slot = accReserved, slot
	c.nAcc++
	return slot, nil
}

// filled records that r's accepted contribution is in its slot: from now on
// r owes a Done within Timeout.
func (c *coord) filled(r int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := &c.ranks[r]
	if st.acc != accReserved {
		return // r left meanwhile
	}
	st.acc, st.due = accFilled, time.Now().Add(c.cfg.Timeout)
	c.notifyLocked()
}

func (c *coord) done(r int, step uint64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.usableLocked(r); err != nil {
		return err
	}
	st := &c.ranks[r]
	if st.acc != accFilled || step != c.cur.step {
		return fmt.Errorf("%w: Done(%d) without an accepted contribution for it (open step %d)", ErrMismatch, step, c.cur.step)
	}
	st.acc = accDone
	c.notifyLocked()
	return nil
}

func (c *coord) liveList() string {
	var b strings.Builder
	for r := range c.ranks {
		if c.ranks[r].status == rankLive {
			if b.Len() > 0 {
				b.WriteByte(',')
			}
			fmt.Fprint(&b, r)
		}
	}
	if b.Len() == 0 {
		return "none"
	}
	return b.String()
}

// loop completes steps and enforces Done and step timeouts until the final
// release, a failure, or Close.
func (c *coord) loop() {
	defer c.wg.Done()
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	c.mu.Lock()
	for c.err == nil && !c.cur.final {
		wake, ready := c.checkLocked(time.Now())
		if c.err != nil {
			break
		}
		if ready {
			c.completeLocked()
			continue
		}
		c.mu.Unlock()
		t.Reset(time.Until(wake))
		select {
		case <-c.kick:
		case <-t.C:
		case <-c.stop:
			return
		}
		c.mu.Lock()
	}
	c.mu.Unlock()
}

// checkLocked drops the ranks late with Done, fails the run if it can no
// longer complete steps, and says whether the open step is complete or
// else when to look again.
func (c *coord) checkLocked(now time.Time) (wake time.Time, ready bool) {
	wake = now.Add(time.Hour)
	for r := range c.ranks {
		st := &c.ranks[r]
		if st.status != rankLive || st.acc != accFilled {
			continue
		}
		if now.Before(st.due) {
			wake = minTime(wake, st.due)
			continue
		}
		c.leaveLocked(r, rankDead, fmt.Errorf("rank %d did not call Done for step %d within %s of its accepted Submit", r, c.cur.step, c.cfg.Timeout), abortDropped)
	}
	need := c.cfg.Need
	if c.live < need {
		c.failLocked(abortLost, fmt.Errorf("%w: %d live rank(s) (%s), fewer than Need (%d): %w", ErrQuorumLost, c.live, c.liveList(), need, c.loss))
		return wake, false
	}
	if c.nAcc < need {
		d := c.opened.Add(c.cfg.StepTimeout)
		if !now.Before(d) {
			c.failLocked(abortLost, fmt.Errorf("%w: step %d collected %d of Need (%d) contributions within StepTimeout (%s); live ranks %s",
				ErrQuorumLost, c.cur.step, c.nAcc, need, c.cfg.StepTimeout, c.liveList()))
			return wake, false
		}
		return minTime(wake, d), false
	}
	for r := range c.ranks {
		st := &c.ranks[r]
		if st.acc == accReserved || (st.acc == accFilled && st.status == rankLive) {
			return wake, false
		}
	}
	return wake, true
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// completeLocked sums the open step's contributions, calls Update on a copy
// of the released state (outside the lock: ranks keep fetching the current
// release meanwhile, and late Submits are rejected since the step is full),
// and releases the result as the next step.
func (c *coord) completeLocked() {
	cur := c.cur
	c.sums = c.sums[:0]
	for r := range c.ranks {
		if st := &c.ranks[r]; st.acc == accFilled || st.acc == accDone {
			c.sums = append(c.sums, st.slot)
		}
	}
	var work *snapshot
	if k := len(c.spare); k > 0 {
		work, c.spare = c.spare[k-1], c.spare[:k-1]
	} else {
		work = &snapshot{data: make([]float32, c.length)}
	}
	c.mu.Unlock()

	copy(work.data, cur.data)
	sum := c.sums[0]
	for _, s := range c.sums[1:] {
		addAfter(sum, s)
	}
	c.cfg.Update(cur.step, sum, c.cfg.Need, work.data)

	c.mu.Lock()
	work.step, work.final, work.refs = cur.step+1, cur.step == c.cfg.Steps, 0
	c.cur = work
	if cur.refs == 0 {
		c.spare = append(c.spare, cur)
	}
	c.slots = append(c.slots, c.sums...)
	clear(c.sums)
	for r := range c.ranks {
		c.ranks[r].acc, c.ranks[r].slot = accNone, nil
	}
	c.nAcc = 0
	c.opened = time.Now()
	c.notifyLocked()
}

func (c *coord) deadline() time.Time { return time.Now().Add(c.cfg.Timeout) }

func (c *coord) peerErr(r int, err error) error {
	return &PeerError{Rank: 0, Op: "quorum", Peer: r, Kind: ErrPeerFailed, Err: err, What: describeIOErr(err, c.cfg.Timeout)}
}

// reader reads rank r's requests. Submit and Done are handled here (a
// contribution is read straight into its slot, or discarded if late); the
// replies, and Next, go to the writer.
func (c *coord) reader(r int) {
	defer c.wg.Done()
	st := &c.ranks[r]
	qc := st.qc
	for {
		h, err := qc.readHeader(context.Background(), time.Time{})
		if err != nil {
			c.lost(r, c.peerErr(r, err))
			return
		}
		reply := qheader{step: h.step}
		switch h.typ {
		case qNext:
			if h.nbytes != 0 {
				c.violation(r, fmt.Errorf("%w: next frame with %d bytes", ErrMismatch, h.nbytes))
				return
			}
			reply.typ = qNext
		case qSubmit:
			if h.nbytes != uint32(4*c.length) {
				c.violation(r, fmt.Errorf("%w: contribution of %d bytes, the state has %d", ErrMismatch, h.nbytes, 4*c.length))
				return
			}
			slot, err := c.reserve(r, h.step)
			if err != nil {
				if errors.Is(err, ErrMismatch) {
					c.violation(r, err)
				}
				return // otherwise the writer sends the abort
			}
			if slot != nil {
				err = qc.readFloats(context.Background(), c.deadline(), slot)
			} else {
				err = qc.discard(c.deadline(), h.nbytes)
			}
			if err != nil {
				c.lost(r, c.peerErr(r, err))
				return
			}
			reply.typ = qVerdict
			if slot != nil {
				c.filled(r)
				reply.flag = qFlagAccepted
			}
		case qDone:
			if err := c.done(r, h.step); err != nil {
				if errors.Is(err, ErrMismatch) {
					c.violation(r, err)
				}
				return
			}
			reply.typ = qDoneAck
		case qBye:
			c.finish(r, h.step)
			return
		default:
			c.violation(r, fmt.Errorf("%w: unexpected %s frame", ErrMismatch, qTypeName(h.typ)))
			return
		}
		select {
		case st.req <- reply:
		case <-st.kill:
			return
		case <-c.failed:
			return
		case <-c.stop:
			return
		}
	}
}

// finish records that r got the final release.
func (c *coord) finish(r int, step uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.cur.final || step != c.cur.step {
		c.leaveLocked(r, rankDead, fmt.Errorf("rank %d left the run at step %d, before the final release", r, step), 0)
		return
	}
	c.leaveLocked(r, rankFinished, nil, 0)
}

// writer sends rank r its replies and releases, heartbeats while r waits in
// Next (so that r can tell a slow step from a dead rank 0), and the abort
// frame when the run fails or r is dropped. It owns the closing of r's
// connection.
func (c *coord) writer(r int) {
	defer c.wg.Done()
	st := &c.ranks[r]
	qc := st.qc
	defer qc.conn.Close()
	tick := time.NewTicker(max(c.cfg.Timeout/3, time.Millisecond))
	defer tick.Stop()
	abort := func() {
		c.mu.Lock()
		code, why := c.code, c.wireReason()
		c.mu.Unlock()
		qc.write(context.Background(), time.Now().Add(min(c.cfg.Timeout, time.Second)), qheader{typ: qAbort, flag: code}, nil, why)
	}
	var waiting bool // r waits in Next
	var last uint64
	for {
		var changed <-chan struct{}
		if waiting {
			s, ch, err := c.fetch(r, last)
			if s != nil {
				h := qheader{typ: qRelease, step: s.step}
				if s.final {
					h.flag = qFlagFinal
				}
				err = qc.write(context.Background(), c.deadline(), h, s.data, "")
				c.unref(s)
				if err != nil {
					c.lost(r, c.peerErr(r, err))
					return
				}
				waiting = false
				continue
			}
			if err == nil {
				changed = ch
			}
		}
		select {
		case h := <-st.req:
			if h.typ == qNext {
				waiting, last = true, h.step
				continue
			}
			if err := qc.write(context.Background(), c.deadline(), h, nil, ""); err != nil {
				c.lost(r, c.peerErr(r, err))
				return
			}
		case <-changed:
		case <-tick.C:
			if waiting {
				if err := qc.write(context.Background(), c.deadline(), qheader{typ: qPing, step: last}, nil, ""); err != nil {
					c.lost(r, c.peerErr(r, err))
					return
				}
			}
		case <-st.kill:
			c.mu.Lock()
			code, why := st.killCode, st.killWhy
			c.mu.Unlock()
			if code != 0 {
				qc.write(context.Background(), time.Now().Add(min(c.cfg.Timeout, time.Second)), qheader{typ: qAbort, flag: code}, nil, why)
			}
			return
		case <-c.failed:
			abort()
			return
		case <-c.stop:
			select {
			case <-c.failed:
				abort()
			default:
			}
			return
		}
	}
}

// close is rank 0's Close: see Quorum.Close.
func (c *coord) close() error {
	c.mu.Lock()
	if c.err == nil && !c.cur.final {
		c.failLocked(abortClosed, fmt.Errorf("%w: rank 0 closed the run at step %d, before the final release (step %d)", ErrClosed, c.cur.step, c.cfg.Steps+1))
	}
	var err error
	if c.err == nil {
		limit := time.NewTimer(c.cfg.Timeout)
		defer limit.Stop()
	wait:
		for {
			var pending []string
			for r := 1; r < c.n; r++ {
				if c.ranks[r].status == rankLive {
					pending = append(pending, fmt.Sprint(r))
				}
			}
			if len(pending) == 0 {
				break
			}
			ch := c.changed
			c.mu.Unlock()
			select {
			case <-ch:
				c.mu.Lock()
			case <-limit.C:
				c.mu.Lock()
				err = fmt.Errorf("collective: rank 0 quorum close: %w: rank(s) %s did not fetch the final release within %s",
					ErrPeerFailed, strings.Join(pending, ","), c.cfg.Timeout)
				c.failLocked(abortClosed, fmt.Errorf("%w: rank 0 closed the run: this rank did not fetch the final release within %s", ErrClosed, c.cfg.Timeout))
				break wait
			}
		}
	}
	c.mu.Unlock()
	c.teardown()
	return err
}

// teardown stops every goroutine of the coordinator and closes the
// connections; writers send the abort first if the run failed.
func (c *coord) teardown() {
	c.stopOnce.Do(func() { close(c.stop) })
	c.wg.Wait()
}
