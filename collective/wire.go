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
	"syscall"
	"time"
	"unsafe"
)

// Operation codes carried in every frame header.
const (
	opRing      = 1 // AllReduce, ring
	opRecursive = 2 // AllReduce, recursive doubling
	opBroadcast = 3
	opBarrier   = 4
)

var opNames = [...]string{opRing: "allreduce", opRecursive: "allreduce", opBroadcast: "broadcast", opBarrier: "barrier"}

// frameHeaderLen is the size of the header in front of every data frame:
//
//	0  uint32 seq      operation sequence number (1 for the group's first)
//	4  uint8  op       opRing, opRecursive, opBroadcast, opBarrier
//	5  uint8  aux      broadcast: root rank; otherwise 0
//	6  uint16 step     algorithm step the frame belongs to
//	8  uint32 total    length of the caller's buffer, in float32 elements
//	12 uint32 nbytes   payload length in bytes (a multiple of 4)
//
// All integers are little-endian. The payload (float32s, little-endian)
// follows.
const frameHeaderLen = 16

// smallWrite is the largest payload copied behind its header into one write.
const smallWrite = 4096

type frameHeader struct {
	seq    uint32
	op     uint8
	aux    uint8
	step   uint16
	total  uint32
	nbytes uint32
}

func (h *frameHeader) put(b []byte) {
	binary.LittleEndian.PutUint32(b[0:], h.seq)
	b[4] = h.op
	b[5] = h.aux
	binary.LittleEndian.PutUint16(b[6:], h.step)
	binary.LittleEndian.PutUint32(b[8:], h.total)
	binary.LittleEndian.PutUint32(b[12:], h.nbytes)
}

func (h *frameHeader) get(b []byte) {
	h.seq = binary.LittleEndian.Uint32(b[0:])
	h.op = b[4]
	h.aux = b[5]
	h.step = binary.LittleEndian.Uint16(b[6:])
	h.total = binary.LittleEndian.Uint32(b[8:])
	h.nbytes = binary.LittleEndian.Uint32(b[12:])
}

// nativeLE reports whether float32s in memory are already in wire order, so
// a []float32 can be sent and received through an unsafe byte view.
var nativeLE = func() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}()

// floatBytes views f as bytes (no copy). Only meaningful on nativeLE hosts.
func floatBytes(f []float32) []byte {
	if len(f) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&f[0])), len(f)*4)
}

// peer is the connection to one other rank. wbuf is used only by the
// goroutine writing to the peer and rbuf only by the one reading from it; an
// operation never has two writers (or two readers) on one peer at a time.
type peer struct {
	rank int
	conn net.Conn
	wbuf [frameHeaderLen + smallWrite]byte // header, then small payloads
	rbuf [frameHeaderLen]byte
	enc  []byte // big-endian hosts only: encoding scratch
}

// opState is what one running operation needs to send and receive frames.
type opState struct {
	g    *Group
	ctx  context.Context
	name string // for errors
	op   uint8
	aux  uint8
	seq  uint32
	tot  uint32
}

func (s *opState) deadline() time.Time { return ioDeadline(s.ctx, s.g.cfg.Timeout) }

// send writes one frame with payload f to p.
func (s *opState) send(p *peer, step int, f []float32) error {
	h := frameHeader{seq: s.seq, op: s.op, aux: s.aux, step: uint16(step), total: s.tot, nbytes: uint32(len(f) * 4)}
	h.put(p.wbuf[:])
	if err := p.conn.SetWriteDeadline(s.deadline()); err != nil {
		return s.ioErr(p, err)
	}
	if err := s.ctx.Err(); err != nil { // checked after arming: see cancelWatch
		return s.ioErr(p, err)
	}
	var payload []byte
	if nativeLE {
		payload = floatBytes(f)
	} else {
		if cap(p.enc) < len(f)*4 {
			p.enc = make([]byte, len(f)*4)
		}
		payload = p.enc[:len(f)*4]
		for i, v := range f {
			binary.LittleEndian.PutUint32(payload[4*i:], math.Float32bits(v))
		}
	}
	var err error
	if len(payload) <= smallWrite {
		// One small write: copy behind the header rather than writev.
		n := copy(p.wbuf[frameHeaderLen:], payload)
		_, err = p.conn.Write(p.wbuf[:frameHeaderLen+n])
	} else {
		bufs := net.Buffers{p.wbuf[:frameHeaderLen], payload}
		_, err = bufs.WriteTo(p.conn)
	}
	if err != nil {
		return s.ioErr(p, err)
	}
	return nil
}

// recv reads one frame from p into dst, whose length is the payload length
// this rank expects. step must match the sender's.
func (s *opState) recv(p *peer, step int, dst []float32) error {
	if err := p.conn.SetReadDeadline(s.deadline()); err != nil {
		return s.ioErr(p, err)
	}
	if err := s.ctx.Err(); err != nil {
		return s.ioErr(p, err)
	}
	if _, err := io.ReadFull(p.conn, p.rbuf[:]); err != nil {
		return s.ioErr(p, err)
	}
	var h frameHeader
	h.get(p.rbuf[:])
	want := frameHeader{seq: s.seq, op: s.op, aux: s.aux, step: uint16(step), total: s.tot, nbytes: uint32(len(dst) * 4)}
	if h != want {
		return s.mismatch(p, h, want)
	}
	if nativeLE {
		if _, err := io.ReadFull(p.conn, floatBytes(dst)); err != nil {
			return s.ioErr(p, err)
		}
		return nil
	}
	if cap(p.enc) < len(dst)*4 {
		p.enc = make([]byte, len(dst)*4)
	}
	b := p.enc[:len(dst)*4]
	if _, err := io.ReadFull(p.conn, b); err != nil {
		return s.ioErr(p, err)
	}
	for i := range dst {
		dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return nil
}

func (s *opState) mismatch(p *peer, got, want frameHeader) error {
	var what string
	switch {
	case got.seq != want.seq:
		what = fmt.Sprintf("is at operation #%d, this rank at #%d", got.seq, want.seq)
	case got.op != want.op:
		what = fmt.Sprintf("runs %s (op %d), this rank %s (op %d)", opName(got.op), got.op, opName(want.op), want.op)
	case got.total != want.total:
		what = fmt.Sprintf("has a buffer of %d elements, this rank %d", got.total, want.total)
	case got.aux != want.aux:
		what = fmt.Sprintf("uses root %d, this rank root %d", got.aux, want.aux)
	default:
		what = fmt.Sprintf("sent step %d with %d bytes, this rank expected step %d with %d bytes", got.step, got.nbytes, want.step, want.nbytes)
	}
	return &PeerError{Rank: s.g.cfg.Rank, Op: s.name, Peer: p.rank, Kind: ErrMismatch, Err: errors.New("unexpected frame"), What: what}
}

func opName(op uint8) string {
	if int(op) < len(opNames) && opNames[op] != "" {
		return opNames[op]
	}
	return "unknown"
}

// ioErr turns an I/O error on p's connection into a PeerError that says what
// happened in words.
func (s *opState) ioErr(p *peer, err error) error {
	if cerr := s.ctx.Err(); cerr != nil {
		return fmt.Errorf("collective: rank %d %s: %w (while waiting for peer rank %d)", s.g.cfg.Rank, s.name, context.Cause(s.ctx), p.rank)
	}
	if s.g.isClosed() {
		return fmt.Errorf("collective: rank %d %s: %w", s.g.cfg.Rank, s.name, ErrClosed)
	}
	what := "failed"
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		what = fmt.Sprintf("did not answer within %s", s.g.cfg.Timeout)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		what = "closed the connection"
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		what = "reset the connection"
	case errors.Is(err, net.ErrClosed):
		what = "was cut off (this rank aborted the operation)"
	}
	return &PeerError{Rank: s.g.cfg.Rank, Op: s.name, Peer: p.rank, Kind: ErrPeerFailed, Err: err, What: what}
}

// The wire of a quorum run (doc.go gives the format): the frames that rank 0
// and the other ranks exchange once joined, the connection that carries
// them, and the quorum kind of hello.

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

// --- cancellation and errors ---------------------------------------------

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
	fields: func(h *hello) []helloField {
		return []helloField{{16, &h.need}, {32, &h.steps}, {40, &h.length}}
	},
}
