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
