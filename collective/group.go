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

// Group is one rank's membership in a group of ranks connected by
// persistent TCP connections (a full mesh). Create it with Join.
//
// Collective operations (AllReduce, Broadcast, Barrier) must be called one
// at a time, in the same order, with the same arguments (buffer length,
// root) on every rank. A Group is safe to share between goroutines, but a
// second operation started while one runs fails at once with ErrBusy rather
// than queueing (queueing could order operations differently on different
// ranks). Close may be called at any time, from any goroutine.
//
// Any failed or cancelled operation breaks the Group: every later operation
// returns ErrGroupBroken. The trainer then closes it and Joins a new Group
// (a larger Generation) with the surviving ranks.
type Group struct {
	cfg   Config
	peers []*peer // by rank; nil at cfg.Rank

	// op allows one operation at a time (TryLock). It guards seq, scratch
	// and unwatch.
	op      sync.Mutex
	seq     uint32
	scratch []float32
	unwatch func() // stops the running operation's cancellation watch

	// mu guards broken and closed.
	mu     sync.Mutex
	broken error
	closed bool
}

// Rank returns this process's rank.
func (g *Group) Rank() int { return g.cfg.Rank }

// Size returns the number of ranks in the group.
func (g *Group) Size() int { return len(g.cfg.Addrs) }

// Generation returns the group's generation.
func (g *Group) Generation() uint64 { return g.cfg.Generation }

// Err returns the error that broke the group, ErrClosed after Close, or nil.
func (g *Group) Err() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return ErrClosed
	}
	return g.broken
}

// Close closes every connection. An operation in progress fails with
// ErrClosed. Close is idempotent.
func (g *Group) Close() error {
	g.mu.Lock()
	already := g.closed
	g.closed = true
	g.mu.Unlock()
	if !already {
		g.closeConns()
	}
	return nil
}

func (g *Group) closeConns() {
	for _, p := range g.peers {
		if p != nil {
			p.conn.Close()
		}
	}
}

func (g *Group) isClosed() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.closed
}

// begin starts an operation: it takes the operation lock and checks that
// the group is usable. The caller must call end.
func (g *Group) begin(ctx context.Context, name string, op uint8, total int) (*opState, error) {
	if !g.op.TryLock() {
		return nil, fmt.Errorf("collective: rank %d %s: %w", g.cfg.Rank, name, ErrBusy)
	}
	if err := g.Err(); err != nil {
		g.op.Unlock()
		if errors.Is(err, ErrClosed) {
			return nil, fmt.Errorf("collective: rank %d %s: %w", g.cfg.Rank, name, ErrClosed)
		}
		return nil, fmt.Errorf("collective: rank %d %s: %w (cause: %w)", g.cfg.Rank, name, ErrGroupBroken, err)
	}
	if total < 0 || int64(total) > 1<<32-1 {
		g.op.Unlock()
		return nil, fmt.Errorf("collective: rank %d %s: %w: buffer of %d elements is larger than 2^32-1", g.cfg.Rank, name, ErrConfig, total)
	}
	g.seq++
	g.unwatch = g.watch(ctx)
	return &opState{g: g, ctx: ctx, name: name, op: op, seq: g.seq, tot: uint32(total)}, nil
}

// end finishes an operation. A failure breaks the group and closes every
// connection, so that the peers' reads and writes fail at once instead of
// waiting for their timeout.
func (g *Group) end(err error) error {
	defer g.op.Unlock()
	g.unwatch()
	if err != nil {
		g.fail(err)
	}
	return err
}

// watch makes ctx's cancellation interrupt blocked reads and writes: it
// moves every connection's deadline to now. The sender and receiver check
// ctx.Err() after arming their own deadline, so a cancellation is never
// lost to a deadline armed just after it. The returned func stops the watch
// and waits for it if it already fired, so that it cannot disturb the next
// operation's deadlines.
func (g *Group) watch(ctx context.Context) func() {
	if ctx.Done() == nil {
		return func() {}
	}
	done := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(done)
		now := time.Now()
		for _, p := range g.peers {
			if p != nil {
				p.conn.SetDeadline(now)
			}
		}
	})
	return func() {
		if !stop() {
			<-done
		}
	}
}

// fail records the first failure and closes every connection. It may be
// called by several goroutines of one operation.
func (g *Group) fail(err error) {
	g.mu.Lock()
	first := g.broken == nil
	if first {
		g.broken = err
	}
	g.mu.Unlock()
	if first {
		g.closeConns()
	}
}

// firstErr returns the recorded failure if there is one, else err: when a
// goroutine of an operation fails and cuts the connections, the others fail
// too, and the first error is the one that says what happened.
func (g *Group) firstErr(err error) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.broken != nil && !g.closed {
		return g.broken
	}
	return err
}

// scratchFloats returns a scratch buffer of n floats, owned by the running
// operation.
func (g *Group) scratchFloats(n int) []float32 {
	if cap(g.scratch) < n {
		g.scratch = make([]float32, n)
	}
	return g.scratch[:n]
}

// --- Join and the handshake ---------------------------------------------

// Handshake message (see doc.go):
//
//	0  [4]byte "RPSC"
//	4  uint16  version (1)
//	6  uint16  status: 0 hello / accepted, 1 refused
//	8  uint32  group size
//	12 uint32  sender's rank
//	16 uint32  rank the sender expects at the other end
//	20 uint32  ChunkBytes
//	24 uint64  Generation
//	32 int64   SmallBytes (-1: never)
//	40 uint8   Algorithm
//	41 uint8   0
//	42 uint16  len(Job)
//	44 uint16  len(reason)
//	46 uint16  0
//	48 Job bytes, then reason bytes (refusals only)
const (
	helloLen     = 48
	helloVersion = 1
	statusOK     = 0
	statusRefuse = 1
	maxReason    = 1024
)

var helloMagic = [4]byte{'R', 'P', 'S', 'C'}

type hello struct {
	status     uint16
	size       uint32
	from, to   uint32
	chunkBytes uint32
	generation uint64
	smallBytes int64
	algorithm  uint8
	job        string
	reason     string
}

func (g *Group) hello(to int, status uint16, reason string) hello {
	return hello{
		status: status, size: uint32(len(g.cfg.Addrs)), from: uint32(g.cfg.Rank), to: uint32(to),
		chunkBytes: uint32(g.cfg.ChunkBytes), generation: g.cfg.Generation,
		smallBytes: int64(g.cfg.SmallBytes), algorithm: uint8(g.cfg.Algorithm),
		job: g.cfg.Job, reason: reason,
	}
}

func (h *hello) marshal() []byte {
	if len(h.reason) > maxReason {
		h.reason = h.reason[:maxReason]
	}
	b := make([]byte, helloLen+len(h.job)+len(h.reason))
	copy(b, helloMagic[:])
	le := binary.LittleEndian
	le.PutUint16(b[4:], helloVersion)
	le.PutUint16(b[6:], h.status)
	le.PutUint32(b[8:], h.size)
	le.PutUint32(b[12:], h.from)
	le.PutUint32(b[16:], h.to)
	le.PutUint32(b[20:], h.chunkBytes)
	le.PutUint64(b[24:], h.generation)
	le.PutUint64(b[32:], uint64(h.smallBytes))
	b[40] = h.algorithm
	le.PutUint16(b[42:], uint16(len(h.job)))
	le.PutUint16(b[44:], uint16(len(h.reason)))
	copy(b[helloLen:], h.job)
	copy(b[helloLen+len(h.job):], h.reason)
	return b
}

func readHello(r io.Reader) (hello, error) {
	var b [helloLen]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return hello{}, err
	}
	if [4]byte(b[:4]) != helloMagic {
		return hello{}, fmt.Errorf("not a collective handshake (magic %q)", b[:4])
	}
	le := binary.LittleEndian
	if v := le.Uint16(b[4:]); v != helloVersion {
		return hello{}, fmt.Errorf("handshake version %d, want %d", v, helloVersion)
	}
	h := hello{
		status: le.Uint16(b[6:]), size: le.Uint32(b[8:]), from: le.Uint32(b[12:]), to: le.Uint32(b[16:]),
		chunkBytes: le.Uint32(b[20:]), generation: le.Uint64(b[24:]), smallBytes: int64(le.Uint64(b[32:])),
		algorithm: b[40],
	}
	jl, rl := int(le.Uint16(b[42:])), int(le.Uint16(b[44:]))
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

// check compares a peer's hello with this rank's settings. It returns why
// the peer does not belong to this group, or "".
func (g *Group) check(h hello, wantFrom int) string {
	c := &g.cfg
	switch {
	case h.job != c.Job:
		return fmt.Sprintf("job %q, this group's is %q", h.job, c.Job)
	case h.generation < c.Generation:
		return fmt.Sprintf("generation %d is stale: this group is generation %d", h.generation, c.Generation)
	case h.generation > c.Generation:
		return fmt.Sprintf("generation %d is newer than this group's (%d)", h.generation, c.Generation)
	case int(h.size) != len(c.Addrs):
		return fmt.Sprintf("group size %d, this group has %d ranks", h.size, len(c.Addrs))
	case int(h.to) != c.Rank:
		return fmt.Sprintf("expects rank %d at %s, this is rank %d", h.to, c.Addrs[c.Rank], c.Rank)
	case wantFrom >= 0 && int(h.from) != wantFrom:
		return fmt.Sprintf("answers as rank %d, expected rank %d", h.from, wantFrom)
	case wantFrom < 0 && (int(h.from) <= c.Rank || int(h.from) >= len(c.Addrs)):
		return fmt.Sprintf("rank %d may not dial rank %d (only higher ranks dial)", h.from, c.Rank)
	case int(h.chunkBytes) != c.ChunkBytes:
		return fmt.Sprintf("ChunkBytes %d, this group uses %d", h.chunkBytes, c.ChunkBytes)
	case h.smallBytes != int64(c.SmallBytes):
		return fmt.Sprintf("SmallBytes %d, this group uses %d", h.smallBytes, c.SmallBytes)
	case Algorithm(h.algorithm) != c.Algorithm:
		return fmt.Sprintf("Algorithm %s, this group uses %s", Algorithm(h.algorithm), c.Algorithm)
	}
	return ""
}

type joinResult struct {
	rank int
	conn net.Conn
	err  error // fatal
}

// Join forms a group: it listens on Addrs[Rank] (or uses Config.Listener),
// dials every lower rank, accepts every higher rank, and checks each peer
// with the handshake. It returns once this rank is connected to all others,
// or fails with ErrRefused (a peer with another job, generation, group size
// or settings), ErrJoinTimeout (some rank never came; the error lists them
// and any refused attempts), or ctx's error.
func Join(ctx context.Context, cfg Config) (*Group, error) {
	lnOwned := cfg.Listener
	cfg, err := cfg.withDefaults()
	if err != nil {
		if lnOwned != nil {
			lnOwned.Close()
		}
		return nil, err
	}
	g := &Group{cfg: cfg, peers: make([]*peer, len(cfg.Addrs))}
	g.cfg.Listener = nil
	n, me := len(cfg.Addrs), cfg.Rank
	if n == 1 {
		if lnOwned != nil {
			lnOwned.Close()
		}
		return g, nil
	}
	ln := lnOwned
	if ln == nil {
		if ln, err = net.Listen("tcp", cfg.Addrs[me]); err != nil {
			return nil, fmt.Errorf("collective: join rank %d: listen on %s: %w", me, cfg.Addrs[me], err)
		}
	}

	ctx, cancel := context.WithTimeoutCause(ctx, cfg.JoinTimeout, ErrJoinTimeout)
	defer cancel()
	results := make(chan joinResult, n)
	var wg sync.WaitGroup
	var notesMu sync.Mutex
	var notes []string // refusals seen, for the timeout error
	note := func(s string) {
		notesMu.Lock()
		notes = append(notes, s)
		notesMu.Unlock()
	}
	deliver := func(r joinResult) {
		select {
		case results <- r:
		case <-ctx.Done():
			if r.conn != nil {
				r.conn.Close()
			}
		}
	}

	// Accept the higher ranks.
	var seenMu sync.Mutex
	seen := make(map[int]bool)
	if me < n-1 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				c, err := ln.Accept()
				if err != nil {
					return // closed when Join returns
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					stop := context.AfterFunc(ctx, func() { c.Close() })
					rank, reason := g.acceptOne(ctx, c, &seenMu, seen)
					if reason != "" {
						note(fmt.Sprintf("refused %s: %s", c.RemoteAddr(), reason))
						c.Close()
						stop()
						return
					}
					if !stop() {
						c.Close()
						return
					}
					deliver(joinResult{rank: rank, conn: c})
				}()
			}
		}()
	}
	// Dial the lower ranks.
	for p := 0; p < me; p++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := g.dialOne(ctx, p, note)
			deliver(joinResult{rank: p, conn: c, err: err})
		}()
	}

	var fatal error
	for got := 0; got < n-1 && fatal == nil; {
		select {
		case r := <-results:
			if r.err != nil {
				fatal = r.err
				break
			}
			g.peers[r.rank] = &peer{rank: r.rank, conn: r.conn}
			got++
		case <-ctx.Done():
			var missing []string
			for p := range n {
				if p != me && g.peers[p] == nil {
					missing = append(missing, fmt.Sprint(p))
				}
			}
			notesMu.Lock()
			why := ""
			if len(notes) > 0 {
				why = "; " + strings.Join(notes, "; ")
			}
			notesMu.Unlock()
			cause := context.Cause(ctx)
			if errors.Is(cause, ErrJoinTimeout) {
				fatal = fmt.Errorf("collective: join rank %d generation %d: %w after %s: no handshake with rank(s) %s%s",
					me, cfg.Generation, ErrJoinTimeout, cfg.JoinTimeout, strings.Join(missing, ","), why)
			} else {
				fatal = fmt.Errorf("collective: join rank %d: %w (no handshake with rank(s) %s%s)", me, cause, strings.Join(missing, ","), why)
			}
		}
	}
	cancel()
	ln.Close()
	wg.Wait()
	if fatal != nil {
		close(results)
		for r := range results {
			if r.conn != nil {
				r.conn.Close()
			}
		}
		g.closeConns()
		return nil, fatal
	}
	for _, p := range g.peers {
		if p != nil {
			p.conn.SetDeadline(time.Time{})
		}
	}
	return g, nil
}

// acceptOne runs the acceptor's side of the handshake. It returns the
// peer's rank, or why it was refused.
func (g *Group) acceptOne(ctx context.Context, c net.Conn, seenMu *sync.Mutex, seen map[int]bool) (int, string) {
	d := time.Now().Add(g.cfg.Timeout)
	if cd, ok := ctx.Deadline(); ok && cd.Before(d) {
		d = cd
	}
	c.SetDeadline(d)
	h, err := readHello(c)
	if err != nil {
		return 0, fmt.Sprintf("bad handshake: %v", err)
	}
	reason := g.check(h, -1)
	if reason == "" {
		seenMu.Lock()
		if seen[int(h.from)] {
			reason = fmt.Sprintf("rank %d is already connected", h.from)
		} else {
			seen[int(h.from)] = true
		}
		seenMu.Unlock()
	}
	status := uint16(statusOK)
	if reason != "" {
		status = statusRefuse
		reason = fmt.Sprintf("rank %d (%s) refused rank %d: %s", g.cfg.Rank, g.cfg.Addrs[g.cfg.Rank], h.from, reason)
	}
	reply := g.hello(int(h.from), status, reason)
	if _, err := c.Write(reply.marshal()); err != nil && reason == "" {
		// The peer will retry; it must not find itself already connected.
		seenMu.Lock()
		delete(seen, int(h.from))
		seenMu.Unlock()
		return 0, fmt.Sprintf("rank %d: writing handshake reply: %v", h.from, err)
	}
	return int(h.from), reason
}

// dialOne connects to the lower rank p, retrying while p is not listening
// yet or is still in an older generation, until ctx ends. A refusal for any
// other reason is fatal.
func (g *Group) dialOne(ctx context.Context, p int, note func(string)) (net.Conn, error) {
	me, addr := g.cfg.Rank, g.cfg.Addrs[p]
	backoff := 5 * time.Millisecond
	var d net.Dialer
	for {
		c, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			var reason string
			var retry bool
			reason, retry, err = g.dialHandshake(ctx, c, p)
			if err == nil && reason == "" {
				return c, nil
			}
			c.Close()
			if reason != "" && !retry {
				return nil, fmt.Errorf("collective: join rank %d: %w: %s", me, ErrRefused, reason)
			}
			if reason != "" {
				note(reason)
			} else {
				note(fmt.Sprintf("handshake with rank %d at %s: %v", p, addr, err))
			}
		}
		select {
		case <-ctx.Done():
			return nil, nil // reported by Join with the missing ranks
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 200*time.Millisecond)
	}
}

// dialHandshake runs the dialer's side. It returns a refusal reason (and
// whether to retry), or an I/O error.
func (g *Group) dialHandshake(ctx context.Context, c net.Conn, p int) (reason string, retry bool, err error) {
	d := time.Now().Add(g.cfg.Timeout)
	if cd, ok := ctx.Deadline(); ok && cd.Before(d) {
		d = cd
	}
	c.SetDeadline(d)
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	h := g.hello(p, statusOK, "")
	if _, err := c.Write(h.marshal()); err != nil {
		return "", false, err
	}
	r, err := readHello(c)
	if err != nil {
		return "", false, err
	}
	if r.status != statusOK {
		// A peer still in an older generation may be about to rejoin.
		return r.reason, r.generation < g.cfg.Generation, nil
	}
	if why := g.check(r, p); why != "" {
		return fmt.Sprintf("rank %d refused rank %d at %s: %s", g.cfg.Rank, p, g.cfg.Addrs[p], why), false, nil
	}
	return "", false, nil
}
