package collective

import (
	"context"
	"fmt"
)

// Broadcast copies root's buf into buf on every other rank. Every rank must
// call it with the same root and a buffer of the same length. Buffers of at
// most Config.SmallBytes bytes go down a binomial tree (log2 n rounds);
// larger ones down a chain root, root+1, ..., root-1, pipelined in frames of
// ChunkBytes. The bytes are copied, so every rank ends bit-identical to root.
func (g *Group) Broadcast(ctx context.Context, buf []float32, root int) error {
	n := len(g.peers)
	if root < 0 || root >= n {
		return fmt.Errorf("collective: rank %d broadcast: %w: root %d is not in [0, %d)", g.cfg.Rank, ErrConfig, root, n)
	}
	s, err := g.begin(ctx, "broadcast", opBroadcast, len(buf))
	if err != nil {
		return err
	}
	s.aux = uint8(root)
	if n == 1 {
		return g.end(nil)
	}
	if g.cfg.SmallBytes >= 0 && 4*int64(len(buf)) <= int64(g.cfg.SmallBytes) {
		err = s.binomial(buf, root)
	} else {
		err = s.chain(buf, root)
	}
	return g.end(err)
}

// binomial: relative rank v = r - root receives from v minus its lowest set
// bit, then sends to v + 2^k for each 2^k below that bit.
func (s *opState) binomial(buf []float32, root int) error {
	g := s.g
	n, r := len(g.peers), g.cfg.Rank
	v := (r - root + n) % n
	abs := func(v int) *peer { return g.peers[(v+root)%n] }
	mask := 1
	for mask < n {
		if v&mask != 0 {
			if err := s.recv(abs(v-mask), 0, buf); err != nil {
				return err
			}
			break
		}
		mask <<= 1
	}
	for mask >>= 1; mask > 0; mask >>= 1 {
		if v+mask < n {
			if err := s.send(abs(v+mask), 0, buf); err != nil {
				return err
			}
		}
	}
	return nil
}

// chain: each rank receives a chunk from its predecessor and forwards it to
// its successor before receiving the next, so the chunks flow down the chain
// as a pipeline.
func (s *opState) chain(buf []float32, root int) error {
	g := s.g
	n, r := len(g.peers), g.cfg.Rank
	v := (r - root + n) % n
	prev, next := g.peers[(r-1+n)%n], g.peers[(r+1)%n]
	chunk := g.cfg.ChunkBytes / 4
	for lo := 0; ; lo += chunk {
		c := buf[lo:min(lo+chunk, len(buf))]
		if v > 0 {
			if err := s.recv(prev, 0, c); err != nil {
				return err
			}
		}
		if v < n-1 {
			if err := s.send(next, 0, c); err != nil {
				return err
			}
		}
		if lo+len(c) == len(buf) {
			return nil
		}
	}
}

// Barrier returns once every rank has called Barrier. It is a dissemination
// barrier: in round k rank r signals r+2^k and waits for r-2^k (mod n), so
// after ceil(log2 n) rounds each rank has heard, directly or not, from all.
func (g *Group) Barrier(ctx context.Context) error {
	s, err := g.begin(ctx, "barrier", opBarrier, 0)
	if err != nil {
		return err
	}
	n, r := len(g.peers), g.cfg.Rank
	for d, step := 1, 0; d < n && err == nil; d, step = d*2, step+1 {
		if err = s.send(g.peers[(r+d)%n], step, nil); err == nil {
			err = s.recv(g.peers[(r-d+n)%n], step, nil)
		}
	}
	return g.end(err)
}
