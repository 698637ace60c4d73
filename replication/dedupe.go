package replication

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"time"
)

// DedupeWindow is how far below a client's highest applied seq a push can
// still be told applied or not. Pushes from one client to one group may
// complete out of order (several in flight, retries), so a single "highest
// seq" would drop a retried lower seq as a duplicate; a window of bits below
// the highest does not.
const DedupeWindow = 256

// DefaultDedupeTTL is how long, in leader time, a client's dedupe state is
// kept after its last push. A client that retries a push after longer than
// this may have it applied twice.
const DefaultDedupeTTL = time.Hour

type clientWindow struct {
	max      uint64                    // highest seq applied
	bits     [DedupeWindow / 64]uint64 // bit i: seq max-i applied
	lastSeen int64                     // leader time of the last push
}

// dedupe is the FSM's record of applied (client, seq) pairs. It is part of the
// replicated state: every replica updates it identically, in log order, and
// it travels in snapshots.
type dedupe struct {
	clients map[uint64]*clientWindow
	ttl     int64
}

func newDedupe(ttl time.Duration) *dedupe {
	return &dedupe{clients: make(map[uint64]*clientWindow), ttl: int64(ttl)}
}

// errDuplicate: the (client, seq) was applied before. Internal: the push is
// answered as applied.
var errDuplicate = errors.New("duplicate push")

// check returns nil if (client, seq) is new at leader time now, errDuplicate
// if it was applied, or ErrSequenceTooOld. It records nothing.
//
// A window idle for longer than the TTL counts as absent here, whether or not
// expire has deleted it yet. That keeps expiry out of the replicated
// semantics: replicas that delete at different moments (one restored from a
// snapshot, say) still answer every check alike.
func (d *dedupe) check(client, seq uint64, now int64) error {
	w := d.clients[client]
	if w == nil || seq > w.max || now-w.lastSeen > d.ttl {
		return nil
	}
	back := w.max - seq
	if back >= DedupeWindow {
		return fmt.Errorf("%w: client %x seq %d is %d below its highest applied seq %d (window %d)", ErrSequenceTooOld, client, seq, back, w.max, DedupeWindow)
	}
	if w.bits[back/64]&(1<<(back%64)) != 0 {
		return errDuplicate
	}
	return nil
}

// record marks (client, seq) applied at leader time now.
func (d *dedupe) record(client, seq uint64, now int64) {
	w := d.clients[client]
	if w == nil || now-w.lastSeen > d.ttl {
		w = &clientWindow{}
		d.clients[client] = w
	}
	w.lastSeen = max(w.lastSeen, now)
	if seq > w.max {
		w.shift(seq - w.max)
		w.max = seq
	}
	back := w.max - seq
	w.bits[back/64] |= 1 << (back % 64)
}

// shift moves the window up by n seqs.
func (w *clientWindow) shift(n uint64) {
	if n >= DedupeWindow {
		w.bits = [DedupeWindow / 64]uint64{}
		return
	}
	words, bits := int(n/64), n%64
	for i := len(w.bits) - 1; i >= 0; i-- {
		var v uint64
		if j := i - words; j >= 0 {
			v = w.bits[j] << bits
			if bits != 0 && j > 0 {
				v |= w.bits[j-1] >> (64 - bits)
			}
		}
		w.bits[i] = v
	}
}

// expire deletes the windows of clients idle for longer than the TTL at
// leader time now, to bound memory. It changes no answer of check (see there).
func (d *dedupe) expire(now int64) {
	for c, w := range d.clients {
		if now-w.lastSeen > d.ttl {
			delete(d.clients, c)
		}
	}
}

// appendTo serialises the state, clients in ascending order so replicas
// write identical bytes.
func (d *dedupe) appendTo(b []byte) []byte {
	ids := make([]uint64, 0, len(d.clients))
	for c := range d.clients {
		ids = append(ids, c)
	}
	slices.Sort(ids)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(ids)))
	for _, c := range ids {
		w := d.clients[c]
		b = binary.LittleEndian.AppendUint64(b, c)
		b = binary.LittleEndian.AppendUint64(b, w.max)
		b = binary.LittleEndian.AppendUint64(b, uint64(w.lastSeen))
		for _, x := range w.bits {
			b = binary.LittleEndian.AppendUint64(b, x)
		}
	}
	return b
}

const dedupeRecord = 8 * (3 + DedupeWindow/64)

// decode replaces the state with what appendTo wrote; it returns the bytes
// consumed.
func (d *dedupe) decode(b []byte) (int, error) {
	if len(b) < 4 {
		return 0, fmt.Errorf("dedupe state truncated")
	}
	n := int(binary.LittleEndian.Uint32(b))
	if n < 0 || len(b)-4 < n*dedupeRecord {
		return 0, fmt.Errorf("dedupe state of %d clients truncated", n)
	}
	clients := make(map[uint64]*clientWindow, n)
	p := b[4:]
	for range n {
		w := &clientWindow{
			max:      binary.LittleEndian.Uint64(p[8:]),
			lastSeen: int64(binary.LittleEndian.Uint64(p[16:])),
		}
		for i := range w.bits {
			w.bits[i] = binary.LittleEndian.Uint64(p[24+8*i:])
		}
		clients[binary.LittleEndian.Uint64(p)] = w
		p = p[dedupeRecord:]
	}
	d.clients = clients
	return 4 + n*dedupeRecord, nil
}
