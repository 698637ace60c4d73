package chain

import (
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"github.com/raftps/raftps/replication"
	"github.com/raftps/raftps/replication/internal/reptest"
)

// badChainCommands are commands no replica can apply, of a table of dim 2
// (see replication's badCommands for the full list; the FSM is shared).
func badChainCommands() [][]byte {
	push := func(count uint64, tail ...byte) []byte {
		b := binary.AppendUvarint(append([]byte{1}, make([]byte, 8)...), count)
		return append(b, tail...)
	}
	oneKey := binary.LittleEndian.AppendUint32(make([]byte, 16), 1) // a push of 1 key, no key or gradients
	return [][]byte{
		push(1 << 62),         // 2^62 pushes in no bytes
		push(2, oneKey...),    // more pushes and rows than it holds
		append(push(0), 0xaa), // bytes after the last push
		{0x7f, 1, 2, 3},       // unknown command type
		{},                    // nothing after the epoch
	}
}

// TestChainSurvivesBadEntries appends bad entries at the head of a real
// three-member chain (gRPC on loopback), as a buggy head would: every member
// persists, forwards and refuses them alike without a panic, pushes keep
// committing, the members' checksums agree, and a restart of every member
// replays the log, bad entries included, to the same state.
func TestChainSurvivesBadEntries(t *testing.T) {
	c := newCluster(t, 3, testConfig(2))
	w := reptest.NewWorkload(2)
	runClients(t, c, w, 2, 20, nil)
	h := c.head()
	for i, cmd := range badChainCommands() {
		e := append(binary.LittleEndian.AppendUint64(nil, h.Epoch()), cmd...)
		h.applyMu.Lock()
		err := h.appendLocked(h.last+1, [][]byte{e}, nil)
		h.applyMu.Unlock()
		if err != nil {
			t.Fatalf("bad entry %d: appending at the head: %v", i, err)
		}
	}
	runClients(t, c, w, 2, 20, nil)
	sum := c.waitConverged(10 * time.Second)
	applied := h.AppliedIndex()
	for _, ch := range c.live() {
		w.Check(t, ch.Table())
	}
	for i := range 3 {
		c.closeChain(i)
	}
	for i := range 3 {
		ch := c.open(i)
		if ch.AppliedIndex() != applied || ch.Checksum() != sum {
			t.Fatalf("member %d reopened at index %d checksum %x; closed at %d %x", i, ch.AppliedIndex(), ch.Checksum(), applied, sum)
		}
	}
	runClients(t, c, w, 1, 5, nil)
	c.waitConverged(10 * time.Second)
}

// TestChainBadEntryRefusedByFSM: the FSM, which chains share with Raft
// groups, refuses each of them with replication.ErrBadEntry.
func TestChainBadEntryRefusedByFSM(t *testing.T) {
	f, err := replication.NewFSM("c", reptest.SGDTable("t", 2), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	for i, cmd := range badChainCommands() {
		if err := f.ApplyCommand(cmd).Err(); !errors.Is(err, replication.ErrBadEntry) {
			t.Fatalf("bad command %d: %v, want ErrBadEntry", i, err)
		}
	}
}
