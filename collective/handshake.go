package collective

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"time"
)

// The connection handshake, shared by Join (full mesh) and JoinQuorum (a
// star around rank 0): the hello message, its checks, the dial loop and the
// accept loop. What differs between the two is described by a helloKind
// (the message layout) and a handshake (how this rank fills in and checks a
// hello); everything else is one code path, so that a fix to it reaches
// both.

// Every hello starts with the same 16 bytes and has its Generation at byte
// 24; its kind places the rest (see groupHello and quorumHello). After the
// fixed part come Job and then the reason (refusals only, at most
// maxReason bytes). All integers are little-endian.
//
//	0  [4]byte magic (the kind's)
//	4  uint16  version (1)
//	6  uint16  status: 0 hello / accepted, 1 refused
//	8  uint32  number of ranks
//	12 uint32  sender's rank
//	24 uint64  Generation
const (
	helloVersion = 1
	statusOK     = 0
	statusRefuse = 1
	maxReason    = 1024
)

// hello is a handshake message of either kind. The fields of the other kind
// stay zero.
type hello struct {
	status      uint16
	size, from  uint32
	generation  uint64
	job, reason string

	// Join's (groupHello).
	to         uint32 // the rank the sender expects at the other end
	chunkBytes uint32
	smallBytes int64
	algorithm  uint8

	// JoinQuorum's (quorumHello).
	need   uint32
	steps  uint64
	length uint64 // state length
}

// helloKind is the layout of one kind of hello. It is part of the wire
// contract: every rank of a job must agree on it, so it never changes
// without a new version.
type helloKind struct {
	name   string  // "collective" or "quorum", for a message of another kind
	magic  [4]byte // tells the kinds (and strays) apart
	length int     // of the fixed part
	lens   int     // offset of the uint16s len(Job) and len(reason)
	// fields places the kind's own fields of h in the fixed part. Both
	// marshal and read go by it, so they cannot disagree.
	fields func(h *hello) []helloField
}

// helloField is one field of a hello and its offset in the fixed part.
type helloField struct {
	off int
	ptr any // *uint8, *uint32, *uint64 or *int64, into a hello
}

// put encodes the kind's own fields of h into b.
func (k *helloKind) put(b []byte, h *hello) {
	le := binary.LittleEndian
	for _, f := range k.fields(h) {
		switch p := f.ptr.(type) {
		case *uint8:
			b[f.off] = *p
		case *uint32:
			le.PutUint32(b[f.off:], *p)
		case *uint64:
			le.PutUint64(b[f.off:], *p)
		case *int64:
			le.PutUint64(b[f.off:], uint64(*p))
		default:
			panic(fmt.Sprintf("collective: %s hello field of type %T", k.name, p))
		}
	}
}

// get decodes the kind's own fields of h from b.
func (k *helloKind) get(b []byte, h *hello) {
	le := binary.LittleEndian
	for _, f := range k.fields(h) {
		switch p := f.ptr.(type) {
		case *uint8:
			*p = b[f.off]
		case *uint32:
			*p = le.Uint32(b[f.off:])
		case *uint64:
			*p = le.Uint64(b[f.off:])
		case *int64:
			*p = int64(le.Uint64(b[f.off:]))
		default:
			panic(fmt.Sprintf("collective: %s hello field of type %T", k.name, p))
		}
	}
}

func (k *helloKind) marshal(h *hello) []byte {
	reason := h.reason
	if len(reason) > maxReason {
		reason = reason[:maxReason]
	}
	b := make([]byte, k.length+len(h.job)+len(reason))
	copy(b, k.magic[:])
	le := binary.LittleEndian
	le.PutUint16(b[4:], helloVersion)
	le.PutUint16(b[6:], h.status)
	le.PutUint32(b[8:], h.size)
	le.PutUint32(b[12:], h.from)
	le.PutUint64(b[24:], h.generation)
	k.put(b, h)
	le.PutUint16(b[k.lens:], uint16(len(h.job)))
	le.PutUint16(b[k.lens+2:], uint16(len(reason)))
	copy(b[k.length:], h.job)
	copy(b[k.length+len(h.job):], reason)
	return b
}

func (k *helloKind) read(r io.Reader) (hello, error) {
	b := make([]byte, k.length)
	if _, err := io.ReadFull(r, b); err != nil {
		return hello{}, err
	}
	if [4]byte(b[:4]) != k.magic {
		return hello{}, fmt.Errorf("not a %s handshake (magic %q)", k.name, b[:4])
	}
	le := binary.LittleEndian
	if v := le.Uint16(b[4:]); v != helloVersion {
		return hello{}, fmt.Errorf("%s handshake version %d, want %d", k.name, v, helloVersion)
	}
	h := hello{status: le.Uint16(b[6:]), size: le.Uint32(b[8:]), from: le.Uint32(b[12:]), generation: le.Uint64(b[24:])}
	k.get(b, &h)
	jl, rl := int(le.Uint16(b[k.lens:])), int(le.Uint16(b[k.lens+2:]))
	if rl > maxReason {
		return hello{}, fmt.Errorf("handshake reason of %d bytes", rl)
	}
	rest := make([]byte, jl+rl)
	if _, err := io.ReadFull(r, rest); err != nil {
		return hello{}, err
	}
	h.job, h.reason = string(rest[:jl]), string(rest[jl:])
	return h, nil
}

// handshake is one rank's side of a join: its hello kind, its settings, and
// how it fills in and checks the kind's own fields.
type handshake struct {
	kind *helloKind
	cfg  *Config
	op   string // "join" or "join quorum": errors read "collective: <op> rank R: ..."
	noun string // "group" or "run": what this rank's settings belong to, in refusals

	// fill sets the kind's fields of this rank's hello to rank to.
	fill func(h *hello, to int)
	// check says why a peer's hello does not fit this rank, or "". Job and
	// Generation were already checked. want is the rank this rank dialled,
	// or -1 on the accepting side.
	check func(h *hello, want int) string
}

func (hs *handshake) hello(to int, status uint16, reason string) hello {
	c := hs.cfg
	h := hello{status: status, size: uint32(len(c.Addrs)), from: uint32(c.Rank), generation: c.Generation, job: c.Job, reason: reason}
	hs.fill(&h, to)
	return h
}

// checkPeer returns why the peer that sent h does not belong with this
// rank, or "".
func (hs *handshake) checkPeer(h *hello, want int) string {
	c := hs.cfg
	switch {
	case h.job != c.Job:
		return fmt.Sprintf("job %q, this %s's is %q", h.job, hs.noun, c.Job)
	case h.generation < c.Generation:
		return fmt.Sprintf("generation %d is stale: this %s is generation %d", h.generation, hs.noun, c.Generation)
	case h.generation > c.Generation:
		return fmt.Sprintf("generation %d is newer than this %s's (%d)", h.generation, hs.noun, c.Generation)
	}
	return hs.check(h, want)
}

// ioDeadline is the deadline of one read or write: Timeout from now, or
// ctx's deadline if that is earlier.
func ioDeadline(ctx context.Context, timeout time.Duration) time.Time {
	d := time.Now().Add(timeout)
	if cd, ok := ctx.Deadline(); ok && cd.Before(d) {
		d = cd
	}
	return d
}

// listen returns ln if it is set, else a new listener on this rank's address.
func (hs *handshake) listen(ln net.Listener) (net.Listener, error) {
	if ln != nil {
		return ln, nil
	}
	me := hs.cfg.Rank
	ln, err := net.Listen("tcp", hs.cfg.Addrs[me])
	if err != nil {
		return nil, fmt.Errorf("collective: %s rank %d: listen on %s: %w", hs.op, me, hs.cfg.Addrs[me], err)
	}
	return ln, nil
}

// dial connects to rank p, retrying while p is not listening yet, a
// handshake fails on the way (p may have lost this rank's hello or its own
// reply), or p is still in an older generation (it may be about to
// rejoin). It returns the connection and p's hello; a refusal for any other
// reason is fatal (ErrRefused). When ctx ends it returns neither connection
// nor error: the caller reports what is missing, with the notes.
func (hs *handshake) dial(ctx context.Context, p int, note func(string)) (net.Conn, hello, error) {
	me, addr := hs.cfg.Rank, hs.cfg.Addrs[p]
	backoff := 5 * time.Millisecond
	var d net.Dialer
	for {
		c, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			peer, reason, retry, err := hs.dialHandshake(ctx, c, p)
			if err == nil && reason == "" {
				return c, peer, nil
			}
			c.Close()
			switch {
			case reason != "" && !retry:
				return nil, hello{}, fmt.Errorf("collective: %s rank %d: %w: %s", hs.op, me, ErrRefused, reason)
			case reason != "":
				note(reason)
			case ctx.Err() == nil: // else the handshake failed because ctx ended
				note(fmt.Sprintf("handshake with rank %d at %s: %v", p, addr, err))
			}
		}
		select {
		case <-ctx.Done():
			return nil, hello{}, nil
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 200*time.Millisecond)
	}
}

// dialHandshake runs the dialling side on c, a new connection to rank p. It
// returns p's hello, or p's refusal (and whether to try again), or an I/O
// error.
func (hs *handshake) dialHandshake(ctx context.Context, c net.Conn, p int) (peer hello, reason string, retry bool, err error) {
	c.SetDeadline(ioDeadline(ctx, hs.cfg.Timeout))
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	h := hs.hello(p, statusOK, "")
	if _, err := c.Write(hs.kind.marshal(&h)); err != nil {
		return hello{}, "", false, err
	}
	r, err := hs.kind.read(c)
	if err != nil {
		return hello{}, "", false, err
	}
	if r.status != statusOK {
		// A peer still in an older generation may be about to rejoin.
		return hello{}, r.reason, r.generation < hs.cfg.Generation, nil
	}
	if why := hs.checkPeer(&r, p); why != "" {
		return hello{}, fmt.Sprintf("rank %d refused rank %d at %s: %s", hs.cfg.Rank, p, hs.cfg.Addrs[p], why), false, nil
	}
	if !stop() {
		// ctx ended just now and closed c.
		return hello{}, "", false, context.Cause(ctx)
	}
	return r, "", false, nil
}

// maxNotes bounds the notes a join keeps for its timeout error: a peer of
// an older generation refuses every retry, a few times a second.
const maxNotes = 8

// notes collects why a join's attempts failed (refusals, broken
// handshakes), for the error if the join times out. It is safe for
// concurrent use.
type notes struct {
	mu   sync.Mutex
	list []string
}

func (n *notes) add(s string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(n.list) < maxNotes {
		n.list = append(n.list, s)
	}
}

func (n *notes) get() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]string(nil), n.list...)
}

// joinErr is the error of a join that ctx ended before it was complete
// (what says what was missing), and its gist for the ranks that had joined
// (rank 0 of a quorum run sends it to them).
func joinErr(ctx context.Context, hs *handshake, what string, notes []string) (gist string, err error) {
	c := hs.cfg
	why := ""
	if len(notes) > 0 {
		why = "; " + strings.Join(notes, "; ")
	}
	if cause := context.Cause(ctx); !errors.Is(cause, ErrJoinTimeout) {
		return fmt.Sprintf("%v (%s)", cause, what),
			fmt.Errorf("collective: %s rank %d: %w (%s%s)", hs.op, c.Rank, cause, what, why)
	}
	return fmt.Sprintf("%s within its JoinTimeout (%s)", what, c.JoinTimeout),
		fmt.Errorf("collective: %s rank %d generation %d: %w after %s: %s%s",
			hs.op, c.Rank, c.Generation, ErrJoinTimeout, c.JoinTimeout, what, why)
}

// joiner collects the connections of one join: from the ranks that dial
// this one (accept) and to the ones this rank dials (dialRank), one
// goroutine each, until every other rank is connected (wait). stop ends it.
type joiner struct {
	hs  *handshake
	ctx context.Context // the join's: it carries JoinTimeout
	// hctx is the handshakes': stop ends it, which closes the connections
	// of the handshakes still in flight.
	hctx    context.Context
	cancel  context.CancelFunc
	ln      net.Listener // closed by stop
	results chan joined
	wg      sync.WaitGroup
	notes   notes

	mu   sync.Mutex   // guards seen
	seen map[int]bool // ranks accepted (or being answered)
}

// joined is one rank's outcome.
type joined struct {
	rank int
	conn net.Conn
	err  error // fatal: the join fails
}

// newJoiner starts a join. It owns ln.
func newJoiner(ctx context.Context, hs *handshake, ln net.Listener) *joiner {
	j := &joiner{hs: hs, ctx: ctx, ln: ln, results: make(chan joined, len(hs.cfg.Addrs)), seen: make(map[int]bool)}
	j.hctx, j.cancel = context.WithCancel(ctx)
	return j
}

// deliver hands a result to wait, or drops it once the join is decided.
func (j *joiner) deliver(r joined) {
	select {
	case j.results <- r:
	case <-j.hctx.Done():
		if r.conn != nil {
			r.conn.Close()
		}
	}
}

// dialRank connects to rank p.
func (j *joiner) dialRank(p int) {
	j.wg.Add(1)
	go func() {
		defer j.wg.Done()
		c, _, err := j.hs.dial(j.hctx, p, j.notes.add)
		if c != nil || err != nil { // else ctx ended, and wait says so
			j.deliver(joined{rank: p, conn: c, err: err})
		}
	}()
}

// accept takes the ranks that dial this one, refusing strays and ranks that
// do not belong, until stop.
func (j *joiner) accept() {
	j.wg.Add(1)
	go func() {
		defer j.wg.Done()
		for {
			c, err := j.ln.Accept()
			if err != nil {
				return // closed by stop
			}
			j.wg.Add(1)
			go func() {
				defer j.wg.Done()
				stop := context.AfterFunc(j.hctx, func() { c.Close() })
				rank, reason := j.acceptHandshake(c)
				if reason != "" {
					j.notes.add(fmt.Sprintf("refused %s: %s", c.RemoteAddr(), reason))
					c.Close()
					stop()
					return
				}
				if !stop() {
					c.Close()
					return
				}
				j.deliver(joined{rank: rank, conn: c})
			}()
		}
	}()
}

// acceptHandshake runs the accepting side on c. It returns the peer's rank,
// or why it was refused.
func (j *joiner) acceptHandshake(c net.Conn) (int, string) {
	hs := j.hs
	me := hs.cfg.Rank
	c.SetDeadline(ioDeadline(j.hctx, hs.cfg.Timeout))
	h, err := hs.kind.read(c)
	if err != nil {
		return 0, fmt.Sprintf("bad handshake: %v", err)
	}
	from := int(h.from)
	reason := hs.checkPeer(&h, -1)
	if reason == "" {
		j.mu.Lock()
		if j.seen[from] {
			reason = fmt.Sprintf("rank %d is already connected", h.from)
		} else {
			j.seen[from] = true
		}
		j.mu.Unlock()
	}
	status := uint16(statusOK)
	if reason != "" {
		status = statusRefuse
		reason = fmt.Sprintf("rank %d (%s) refused rank %d: %s", me, hs.cfg.Addrs[me], h.from, reason)
	}
	reply := hs.hello(from, status, reason)
	if _, err := c.Write(hs.kind.marshal(&reply)); err != nil && reason == "" {
		// The peer will retry; it must not find itself already connected.
		j.mu.Lock()
		delete(j.seen, from)
		j.mu.Unlock()
		return 0, fmt.Sprintf("rank %d: writing handshake reply: %v", h.from, err)
	}
	return from, reason
}

// wait returns the connection of every other rank, indexed by rank, once
// all are connected. If the join fails (a fatal refusal, or ctx ended) it
// returns the error, the gist of a timeout for the ranks that joined, and
// the connections it has: the caller closes them.
func (j *joiner) wait() (conns []net.Conn, gist string, err error) {
	c := j.hs.cfg
	n := len(c.Addrs)
	conns = make([]net.Conn, n)
	for got := 0; got < n-1; {
		select {
		case r := <-j.results:
			if r.err != nil {
				return conns, "", r.err
			}
			conns[r.rank] = r.conn
			got++
		case <-j.ctx.Done():
			var missing []string
			for p := range n {
				if p != c.Rank && conns[p] == nil {
					missing = append(missing, fmt.Sprint(p))
				}
			}
			gist, err := joinErr(j.ctx, j.hs, "no handshake with rank(s) "+strings.Join(missing, ","), j.notes.get())
			return conns, gist, err
		}
	}
	return conns, "", nil
}

// stop ends the handshakes still in flight, closes the listener, and waits
// for the joiner's goroutines. A connection that arrived too late is closed.
func (j *joiner) stop() {
	j.cancel()
	j.ln.Close()
	j.wg.Wait()
	close(j.results)
	for r := range j.results {
		if r.conn != nil {
			r.conn.Close()
		}
	}
}
