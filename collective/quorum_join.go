package collective

import (
	"context"
	"fmt"
	"net"
	"time"
)

// Joining a quorum run: the handshake's quorum settings (handshake.go runs
// it), then the start: a rank > 0 dials rank 0 and waits for its start
// frame; rank 0 accepts every other rank, then starts the run.

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
