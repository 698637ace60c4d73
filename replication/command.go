package replication

import (
	"encoding/binary"
	"fmt"
	"slices"
	"unsafe"

	"github.com/raftps/raftps/store"
)

// A log entry of a shard replica is one command (a chain entry's, after the
// entry's epoch). The first byte says which:
//
//	push batch: cmdPush | leader time i64 (unix ns) | count uvarint | count × push
//	push:       client u64 | seq u64 | keys u32 | keys × u64 | keys × dim × f32
//	bf16 push:  client u64 | seq u64 | keys u32 with bit 31 set | keys × u64 | keys × dim × bf16
//
// all little-endian. Keys and float32 gradients are copied in and out as
// whole byte runs, never converted element by element; bfloat16 gradients
// (a table of grad precision bf16) take half the bytes and are widened
// exactly on the way out (store/bf16.go), so every replica applies the same
// float32 values. The leader time is the leader's
// wall clock when it built the entry; replicas use it, never their own
// clocks, so everything derived from it (dedupe expiry) is the same on all.
//
// A new leader appends a noop command (just the type byte) rather than using
// raft's Barrier: raft applies its own LogNoop and LogBarrier entries without
// showing them to the FSM, so a read waiting for the FSM to reach the commit
// index would wait for ever if that index were one of them.
const (
	cmdPush byte = 1
	cmdNoop byte = 2
)

// Push is one client's push to one shard: rows of gradients for keys.
type Push struct {
	Client uint64
	Seq    uint64
	Keys   []uint64
	Grads  []float32 // len(Keys) × dim
	// BF16: log the gradients as bfloat16, half the bytes. Each should
	// already be a value bfloat16 holds (rounded where the push came in,
	// store.RoundBF16), so that what the leader validated is what every
	// replica applies; the encoding rounds again, which changes nothing.
	BF16 bool
}

// pushBF16 marks a push of bfloat16 gradients in its key count word. No
// push comes near 2^31 keys: an entry is at most MaxRaftMessageBytes.
const pushBF16 = 1 << 31

func (p *Push) gradBytes() int {
	if p.BF16 {
		return store.BF16Bytes
	}
	return 4
}

func (p *Push) encodedSize() int { return 8 + 8 + 4 + len(p.Keys)*8 + len(p.Grads)*p.gradBytes() }

// appendPushBatchHeader starts a push batch of count pushes; appendPush
// then adds each.
func appendPushBatchHeader(b []byte, leaderTime int64, count int) []byte {
	b = append(b, cmdPush)
	b = binary.LittleEndian.AppendUint64(b, uint64(leaderTime))
	return binary.AppendUvarint(b, uint64(count))
}

// pushBatchHeaderMax is the most bytes appendPushBatchHeader writes.
const pushBatchHeaderMax = 1 + 8 + binary.MaxVarintLen64

func appendPush(b []byte, p *Push) []byte {
	b = binary.LittleEndian.AppendUint64(b, p.Client)
	b = binary.LittleEndian.AppendUint64(b, p.Seq)
	n := uint32(len(p.Keys))
	if p.BF16 {
		n |= pushBF16
	}
	b = binary.LittleEndian.AppendUint32(b, n)
	b = append(b, KeysBytes(p.Keys)...)
	if p.BF16 {
		return store.AppendBF16(b, p.Grads)
	}
	return append(b, ValuesBytes(p.Grads)...)
}

// encodePushBatch returns the command for pushes.
func encodePushBatch(leaderTime int64, pushes []*Push) []byte {
	b := appendPushBatchHeader(nil, leaderTime, len(pushes))
	for _, p := range pushes {
		b = appendPush(b, p)
	}
	return b
}

// pushBatchReader walks a push batch command without allocating: each Push
// it yields reuses the reader's buffers and is valid until the next call.
type pushBatchReader struct {
	dim        int
	leaderTime int64
	left       uint64
	rest       []byte
	cur        Push
}

func (r *pushBatchReader) reset(cmd []byte, dim int) error {
	if len(cmd) < 9 || cmd[0] != cmdPush {
		return fmt.Errorf("push batch: bad header")
	}
	if dim < 1 || dim > store.MaxDim {
		return fmt.Errorf("push batch: dimension %d", dim)
	}
	r.dim = dim
	r.leaderTime = int64(binary.LittleEndian.Uint64(cmd[1:]))
	n, k := binary.Uvarint(cmd[9:])
	if k <= 0 {
		return fmt.Errorf("push batch: bad count")
	}
	r.left, r.rest = n, cmd[9+k:]
	// Every push takes at least its header: a count the bytes cannot hold
	// is refused before anything is sized by it.
	if n > uint64(len(r.rest)/pushHeader) {
		return fmt.Errorf("push batch: %d pushes declared in %d bytes", n, len(r.rest))
	}
	return nil
}

// pushHeader is the size of a push before its keys: client, seq, key count.
const pushHeader = 8 + 8 + 4

// validate walks the rest of the batch without copying anything and
// returns why it does not decode whole, if it does not. The reader itself
// does not move (it is a copy).
func (r pushBatchReader) validate() error {
	for {
		_, _, size, ok, err := r.span()
		if !ok {
			return err
		}
		r.rest = r.rest[size:]
		r.left--
	}
}

// span checks that the next push is whole and returns its key count,
// whether its gradients are bfloat16, and its encoded size; ok is false at
// the end.
func (r *pushBatchReader) span() (n int, bf16 bool, size int, ok bool, err error) {
	if r.left == 0 {
		if len(r.rest) != 0 {
			return 0, false, 0, false, fmt.Errorf("push batch: %d bytes after the last push", len(r.rest))
		}
		return 0, false, 0, false, nil
	}
	if len(r.rest) < pushHeader {
		return 0, false, 0, false, fmt.Errorf("push batch: truncated push header")
	}
	// Compared by division, so that no product of a declared count can
	// overflow whatever the dimension.
	word := binary.LittleEndian.Uint32(r.rest[16:])
	bf16 = word&pushBF16 != 0
	keys := uint64(word &^ pushBF16)
	row := uint64(8 + r.dim*4)
	if bf16 {
		row = uint64(8 + r.dim*store.BF16Bytes)
	}
	if keys > uint64(len(r.rest)-pushHeader)/row {
		return 0, false, 0, false, fmt.Errorf("push batch: push of %d keys truncated", keys)
	}
	n = int(keys)
	return n, bf16, pushHeader + n*int(row), true, nil
}

// next returns the next push, or nil at the end.
func (r *pushBatchReader) next() (*Push, error) {
	n, bf16, need, ok, err := r.span()
	if !ok {
		return nil, err
	}
	p := &r.cur
	p.Client = binary.LittleEndian.Uint64(r.rest)
	p.Seq = binary.LittleEndian.Uint64(r.rest[8:])
	p.Keys = growU64(p.Keys, n)
	p.Grads = growF32(p.Grads, n*r.dim)
	p.BF16 = bf16
	copy(KeysBytes(p.Keys), r.rest[pushHeader:pushHeader+n*8])
	if bf16 {
		store.WidenBF16(p.Grads, r.rest[pushHeader+n*8:need]) // span checked the length
	} else {
		copy(ValuesBytes(p.Grads), r.rest[pushHeader+n*8:need])
	}
	r.rest = r.rest[need:]
	r.left--
	return p, nil
}

// PushedKeys appends to dst the keys of every push in cmd, a command of a
// table of dimension dim, in order and with repeats: nothing for a command
// that is not a push batch, and, of a batch that does not decode whole, the
// keys of the pushes before the first bad one.
func PushedKeys(dst []uint64, cmd []byte, dim int) []uint64 {
	var r pushBatchReader
	if r.reset(cmd, dim) != nil {
		return dst
	}
	for {
		n, _, size, ok, _ := r.span()
		if !ok {
			return dst
		}
		k := len(dst)
		dst = slices.Grow(dst, n)[:k+n]
		copy(KeysBytes(dst[k:]), r.rest[pushHeader:pushHeader+n*8])
		r.rest = r.rest[size:]
		r.left--
	}
}

func growU64(b []uint64, n int) []uint64 {
	if cap(b) < n {
		return make([]uint64, n)
	}
	return b[:n]
}

func growF32(b []float32, n int) []float32 {
	if cap(b) < n {
		return make([]float32, n)
	}
	return b[:n]
}

// KeysBytes and ValuesBytes view a slice's memory as bytes, without a copy:
// how commands, and chain replication's messages, carry keys and values.
// The wire format is little-endian; so is every platform raftps builds for
// (checked in init).
func KeysBytes(v []uint64) []byte {
	if len(v) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), len(v)*8)
}

func ValuesBytes(v []float32) []byte {
	if len(v) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), len(v)*4)
}

func init() {
	if binary.NativeEndian.Uint16([]byte{1, 0}) != 1 {
		panic("raftps replication: big-endian platforms are not supported (the wire format is copied as memory)")
	}
}
