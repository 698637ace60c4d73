package collective

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
)

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
