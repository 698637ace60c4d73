package collective

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"sync"
)

// Op is a reduction.
type Op uint8

const (
	// Sum adds the buffers element-wise.
	Sum Op = iota
	// Mean adds the buffers and divides by the group size.
	Mean
)

func (o Op) String() string {
	switch o {
	case Sum:
		return "sum"
	case Mean:
		return "mean"
	}
	return fmt.Sprintf("Op(%d)", uint8(o))
}

// AllReduce reduces buf element-wise across all ranks, in place: on return
// every rank's buf holds the same, bit-identical result. Every rank must
// call it with a buffer of the same length and the same op. See the package
// documentation for the algorithms and the determinism guarantee.
//
// ctx cancels the operation (which breaks the group); a peer that fails or
// is silent for Config.Timeout makes it fail with a *PeerError.
func (g *Group) AllReduce(ctx context.Context, buf []float32, op Op) error {
	if op > Mean {
		return fmt.Errorf("collective: rank %d allreduce: %w: unknown op %d", g.cfg.Rank, ErrConfig, op)
	}
	algo := g.algorithmFor(len(buf))
	code := uint8(opRing)
	if algo == RecursiveDoubling {
		code = opRecursive
	}
	s, err := g.begin(ctx, "allreduce", code, len(buf))
	if err != nil {
		return err
	}
	if len(g.peers) == 1 {
		return g.end(nil) // dividing by 1 changes nothing
	}
	if algo == RecursiveDoubling {
		err = s.recursiveDoubling(buf, op)
	} else {
		err = s.ring(buf, op)
	}
	return g.end(err)
}

// algorithmFor returns the algorithm AllReduce uses for n elements. It
// depends only on n and the Config, which the handshake checked is the same
// on every rank, so all ranks choose alike.
func (g *Group) algorithmFor(n int) Algorithm {
	switch g.cfg.Algorithm {
	case Ring, RecursiveDoubling:
		return g.cfg.Algorithm
	}
	if g.cfg.SmallBytes >= 0 && 4*int64(n) <= int64(g.cfg.SmallBytes) {
		return RecursiveDoubling
	}
	return Ring
}

// segment returns the bounds of segment j (taken mod n) when l elements
// are split into n nearly equal segments.
func segment(j, n, l int) (lo, hi int) {
	j = ((j % n) + n) % n
	return int(int64(j) * int64(l) / int64(n)), int(int64(j+1) * int64(l) / int64(n))
}

// ring runs the ring allreduce: n-1 reduce-scatter steps then n-1 allgather
// steps. At step t rank r sends segment r-t to r+1 and receives segment
// r-1-t from r-1 (mod n): during reduce-scatter it adds what it receives to
// its own segment; during allgather it copies it. Each segment travels as
// frames of at most ChunkBytes; frame (t, k) is chunk k of step t.
//
// One goroutine sends every frame of the operation while this one receives
// and reduces. What step t+1 sends is exactly what step t received (segment
// r-1-t, cut into the same chunks), so frame (t+1, k) can go as soon as
// frame (t, k) is received and reduced: the receiver hands the sender a
// token on ready for each such frame. The steps are not run one after the
// other: both ends send and receive the frames in the same fixed wavefront
// order (ringOrder), which interleaves the steps so that a chunk is
// forwarded right after it was reduced, while it is still in cache, and a
// rank's own chunk comes back summed soon after it was sent. Only the order
// of frames on the wire changes; which rank adds what, and in which order,
// does not.
//
// A chunk is never overwritten while it may still be being sent: a rank
// receives into segment X during the allgather only the final sum of X,
// which every rank's contribution to X went into, including the frame this
// rank sent from X.
//
// Segment j is reduced along the chain j, j+1, ..., j-1: rank j+i computes
// (x_j + ... + x_{j+i-1}) + x_{j+i}, and rank j-1 ends with the full sum (and
// for Mean divides it by n). The allgather then copies those bytes to every
// rank, so all ranks hold bit-identical results.
func (s *opState) ring(buf []float32, op Op) error {
	if ringSched == schedLockstep {
		return s.ringLockstep(buf, op)
	}
	g := s.g
	n, r, l := len(g.peers), g.cfg.Rank, len(buf)
	right, left := g.peers[(r+1)%n], g.peers[(r-1+n)%n]
	chunk := g.cfg.ChunkBytes / 4
	scratch := g.scratchFloats(min(chunk, l/n+1))
	steps := 2 * (n - 1)

	// ready holds a token per frame received in steps 0..steps-2, each the
	// go-ahead to forward that chunk; the sender takes them in the order the
	// receiver gives them (ringOrder maps (t, k) to (t+1, k) order-
	// preservingly). Its elements take no memory, so it can hold every token
	// of the operation and the receiver never blocks on it. abort wakes a
	// sender waiting for a token that will not come.
	ready := make(chan struct{}, (steps-1)*((l/n+1)/chunk+1))
	abort := make(chan struct{})
	sendDone := make(chan struct{})
	var sendErr error
	go func() {
		defer close(sendDone)
		sendErr = s.ringSend(right, buf, chunk, ready, abort)
		if sendErr != nil && sendErr != errAborted {
			g.fail(sendErr)
		}
	}()

	var recvErr error
	for t, k := range ringOrder(n, r-1, l, chunk) {
		rLo, rHi := segment(r-1-t, n, l)
		lo := rLo + k*chunk
		c := buf[lo:min(lo+chunk, rHi)]
		if recvErr = s.recvChunk(left, t, c, scratch, op, addInto); recvErr != nil {
			break
		}
		if t < steps-1 {
			ready <- struct{}{}
		}
		if testHookRecv != nil {
			testHookRecv(g, t)
		}
	}
	if recvErr != nil {
		g.fail(recvErr) // before the sender can fail on the cut connections
		close(abort)
	}
	<-sendDone
	if recvErr != nil {
		return recvErr
	}
	return sendErr
}

// ringSend is the ring's sender: every frame of the operation in ringOrder.
// Frames of step 0 (this rank's own segment) go at once; a frame (t, k) of
// a later step waits for its token on ready.
func (s *opState) ringSend(right *peer, buf []float32, chunk int, ready, abort <-chan struct{}) error {
	n, r, l := len(s.g.peers), s.g.cfg.Rank, len(buf)
	for t, k := range ringOrder(n, r, l, chunk) {
		if t > 0 {
			select {
			case <-ready:
			case <-abort:
				return errAborted
			}
		}
		sLo, sHi := segment(r-t, n, l)
		lo := sLo + k*chunk
		if err := s.send(right, t, buf[lo:min(lo+chunk, sHi)]); err != nil {
			return err
		}
	}
	return nil
}

// ringOrder yields the frames (t, k) that rank r sends, which are the frames
// rank r+1 receives, in wire order: at step t rank r sends segment r-t, in
// chunks k = 0 .. chunks(t)-1 (one, possibly empty, if the segment is
// empty). The default order is a wavefront: frames are sorted by
// k+lag*t, then by t, so that frame (t+1, k) comes lag waves after (t, k)
// and each link carries several steps at once. That order is preserved by
// the map (t, k) -> (t+1, k), which is why one FIFO of tokens suffices, and
// every frame a sender or receiver waits for comes earlier in it, so the
// ring cannot deadlock. Under
// schedStepMajor (benchmarks only) the order is by (t, k): the steps one
// after the other, each chunk forwarded as soon as it is reduced.
func ringOrder(n, r, l, chunk int) iter.Seq2[int, int] {
	steps := 2 * (n - 1)
	chunks := func(t int) int {
		lo, hi := segment(r-t, n, l)
		return max(1, (hi-lo+chunk-1)/chunk)
	}
	return func(yield func(t, k int) bool) {
		if ringSched == schedStepMajor {
			for t := range steps {
				for k := range chunks(t) {
					if !yield(t, k) {
						return
					}
				}
			}
			return
		}
		most := 0
		for t := range steps {
			most = max(most, chunks(t))
		}
		// Frame (t+1, k) comes lag waves after (t, k). A lag of a few
		// chunks rather than one leaves the sender some frames in hand
		// while it waits for a token; with few chunks per segment a lag of
		// one keeps the steps overlapping.
		lag := min(4, max(1, most/4))
		if ringLag > 0 {
			lag = ringLag
		}
		for wave := 0; wave < most+lag*(steps-1); wave++ {
			for t := range min(wave/lag+1, steps) {
				if k := wave - lag*t; k < chunks(t) {
					if !yield(t, k) {
						return
					}
				}
			}
		}
	}
}

// Ring schedules: the default wavefront, and two kept so that benchmarks
// can compare them in one run.
const (
	schedWavefront = iota
	schedStepMajor // pipelined, steps in order
	schedLockstep  // ringLockstep, the ring before pipelining
)

// ringLag, if positive, overrides the wavefront's lag (benchmarks only).
var ringLag = 0

// ringSched selects the ring schedule (benchmarks only; set it while no
// operation runs).
var ringSched = schedWavefront

// recvChunk receives step t's frame for chunk c of the ring from left:
// in the reduce-scatter steps (t < n-1) into scratch, then added into c
// with add (divided by n at the last such step, for Mean); in the allgather
// steps straight into c, since it is the final sum.
func (s *opState) recvChunk(left *peer, t int, c, scratch []float32, op Op, add func(dst, src []float32)) error {
	n := len(s.g.peers)
	if t >= n-1 {
		return s.recv(left, t, c)
	}
	in := scratch[:len(c)]
	if err := s.recv(left, t, in); err != nil {
		return err
	}
	add(c, in)
	if t == n-2 && op == Mean {
		divide(c, float32(n))
	}
	return nil
}

// errAborted is what the ring's sender returns when the receiver failed
// first; the receiver's error is the one reported.
var errAborted = errors.New("collective: ring sender aborted")

// ringLockstep runs the ring as it did before ring was pipelined across
// steps: the same frames, the same additions in the same order, but step
// t+1's sender starts only once step t is fully received, and it adds
// with the plain Go loop. It is kept, behind ringSched, so that benchmarks
// can compare the old ring with the new in one run.
func (s *opState) ringLockstep(buf []float32, op Op) error {
	g := s.g
	n, r, l := len(g.peers), g.cfg.Rank, len(buf)
	right, left := g.peers[(r+1)%n], g.peers[(r-1+n)%n]
	chunk := g.cfg.ChunkBytes / 4
	scratch := g.scratchFloats(min(chunk, l/n+1))
	for t := 0; t < 2*(n-1); t++ {
		sLo, sHi := segment(r-t, n, l)
		rLo, rHi := segment(r-1-t, n, l)
		var wg sync.WaitGroup
		var sendErr error
		wg.Add(1)
		go func() {
			defer wg.Done()
			sendErr = s.sendChunks(right, t, buf[sLo:sHi], chunk)
			if sendErr != nil {
				g.fail(sendErr)
			}
		}()
		dst := buf[rLo:rHi]
		var recvErr error
		for k := 0; ; k++ {
			lo := k * chunk
			hi := min(lo+chunk, len(dst))
			c := dst[lo:hi]
			if recvErr = s.recvChunk(left, t, c, scratch, op, addIntoGo); recvErr != nil {
				break
			}
			if testHookRecv != nil {
				testHookRecv(g, t)
			}
			if hi == len(dst) {
				break
			}
		}
		if recvErr != nil {
			g.fail(recvErr)
		}
		wg.Wait()
		if recvErr != nil {
			return recvErr
		}
		if sendErr != nil {
			return sendErr
		}
	}
	return nil
}

// testHookRecv, if set (by tests only, before any group exists), is called
// by the ring after each chunk it receives.
var testHookRecv func(g *Group, step int)

// sendChunks sends seg as frames of at most chunk elements (one empty frame
// if seg is empty, so that a rank whose buffer length differs is detected).
func (s *opState) sendChunks(p *peer, step int, seg []float32, chunk int) error {
	for lo := 0; ; lo += chunk {
		hi := min(lo+chunk, len(seg))
		if err := s.send(p, step, seg[lo:hi]); err != nil {
			return err
		}
		if hi == len(seg) {
			return nil
		}
	}
}

// recursiveDoubling runs recursive doubling, log2(p) exchanges of the whole
// buffer, p the largest power of two <= n. When n is not a power of two, the
// first 2(n-p) ranks pair up first: each even rank among them sends its
// buffer to the next odd rank, sits out, and gets the result back at the
// end. In every addition the operand from the lower ranks comes first, and
// both partners of an exchange add the same two values, so every rank
// computes bit-identical sums (even NaN payloads agree).
func (s *opState) recursiveDoubling(buf []float32, op Op) error {
	g := s.g
	n, r := len(g.peers), s.g.cfg.Rank
	p := 1
	for p*2 <= n {
		p *= 2
	}
	rem := n - p
	scratch := g.scratchFloats(len(buf))
	step := 0
	v := r - rem // virtual rank among the p ranks that exchange
	if r < 2*rem {
		if r%2 == 0 {
			if err := s.send(g.peers[r+1], step, buf); err != nil {
				return err
			}
			return s.recv(g.peers[r+1], step+1, buf)
		}
		if err := s.recv(g.peers[r-1], step, scratch); err != nil {
			return err
		}
		addInto(buf, scratch) // buf = x_{r-1} + x_r
		v = r / 2
	}
	real := func(v int) int {
		if v < rem {
			return 2*v + 1
		}
		return v + rem
	}
	for mask := 1; mask < p; mask <<= 1 {
		step++
		pv := v ^ mask
		if err := s.exchange(g.peers[real(pv)], step, buf, scratch); err != nil {
			return err
		}
		if pv < v {
			addInto(buf, scratch) // buf = theirs + mine
		} else {
			addAfter(buf, scratch) // buf = mine + theirs
		}
	}
	if op == Mean {
		divide(buf, float32(n))
	}
	if r < 2*rem {
		return s.send(g.peers[r-1], 1, buf)
	}
	return nil
}

// exchange sends out to p and receives p's frame into in, concurrently (a
// large frame may not fit in the socket buffers, so both sides writing
// first would deadlock).
func (s *opState) exchange(p *peer, step int, out, in []float32) error {
	if len(out)*4 <= smallWrite {
		if err := s.send(p, step, out); err != nil {
			return err
		}
		return s.recv(p, step, in)
	}
	var wg sync.WaitGroup
	var sendErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		if sendErr = s.send(p, step, out); sendErr != nil {
			s.g.fail(sendErr)
		}
	}()
	recvErr := s.recv(p, step, in)
	if recvErr != nil {
		s.g.fail(recvErr)
	}
	wg.Wait()
	if recvErr != nil {
		return recvErr
	}
	return sendErr
}

// addIntoGo sets dst[i] = src[i] + dst[i]: addInto in Go, for the tail
// of a buffer and for other architectures.
func addIntoGo(dst, src []float32) {
	src = src[:len(dst)]
	for i := range dst {
		dst[i] = src[i] + dst[i]
	}
}

// addAfter sets dst[i] = dst[i] + src[i].
func addAfter(dst, src []float32) {
	src = src[:len(dst)]
	for i := range dst {
		dst[i] = dst[i] + src[i]
	}
}

func divide(dst []float32, d float32) {
	for i := range dst {
		dst[i] /= d
	}
}
