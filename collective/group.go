package collective

import (
	"context"
	"errors"
	"fmt"
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

// Generation returns the group's generation.
func (g *Group) Generation() uint64 { return g.cfg.Generation }

// Size returns the number of ranks in the group.
func (g *Group) Size() int { return len(g.cfg.Addrs) }

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
// waiting for their timeout; the error returned is the operation's first
// (firstErr), not whichever goroutine's failure err happens to be.
func (g *Group) end(err error) error {
	defer g.op.Unlock()
	g.unwatch()
	if err != nil {
		err = g.firstErr(err)
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

// groupHello is Join's hello (see doc.go and handshake.go):
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
var groupHello = helloKind{
	name: "collective", magic: [4]byte{'R', 'P', 'S', 'C'}, length: 48, lens: 42,
	fields: func(h *hello) []helloField {
		return []helloField{{16, &h.to}, {20, &h.chunkBytes}, {32, &h.smallBytes}, {40, &h.algorithm}}
	},
}

// groupHandshake is the handshake of a rank of a group with settings c.
func groupHandshake(c *Config) *handshake {
	return &handshake{
		kind: &groupHello, cfg: c, op: "join", noun: "group",
		fill: func(h *hello, to int) {
			h.to, h.chunkBytes, h.smallBytes, h.algorithm = uint32(to), uint32(c.ChunkBytes), int64(c.SmallBytes), uint8(c.Algorithm)
		},
		check: func(h *hello, wantFrom int) string {
			switch {
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
		},
	}
}

// Join forms a group: it listens on Addrs[Rank] (or uses Config.Listener),
// dials every lower rank, accepts every higher rank, and checks each peer
// with the handshake. It returns once this rank is connected to all others,
// or fails with ErrRefused (a peer with another job, generation, group size
// or settings), ErrJoinTimeout (some rank never came; the error lists them
// and the first refused attempts), or ctx's error.
func Join(ctx context.Context, cfg Config) (*Group, error) {
	cfg, err := cfg.withDefaults()
	ln := cfg.takeListener(err == nil && len(cfg.Addrs) > 1)
	if err != nil {
		return nil, err
	}
	g := &Group{cfg: cfg, peers: make([]*peer, len(cfg.Addrs))}
	n, me := len(cfg.Addrs), cfg.Rank
	if n == 1 {
		return g, nil
	}
	hs := groupHandshake(&g.cfg)
	if ln, err = hs.listen(ln); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeoutCause(ctx, cfg.JoinTimeout, ErrJoinTimeout)
	defer cancel()
	j := newJoiner(ctx, hs, ln)
	if me < n-1 {
		j.accept()
	}
	for p := range me {
		j.dialRank(p)
	}
	conns, _, err := j.wait()
	j.stop()
	for p, c := range conns {
		if c == nil {
			continue
		}
		if err != nil {
			c.Close()
			continue
		}
		c.SetDeadline(time.Time{})
		g.peers[p] = &peer{rank: p, conn: c}
	}
	if err != nil {
		return nil, err
	}
	return g, nil
}
