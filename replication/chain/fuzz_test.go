package chain

import (
	"encoding/binary"
	"slices"
	"testing"
	"time"

	"github.com/raftps/raftps/replication"
	"github.com/raftps/raftps/replication/chain/chainpb"
	"github.com/raftps/raftps/replication/internal/reptest"
	"google.golang.org/protobuf/proto"
)

// FuzzChainEntries feeds arbitrary bytes to a chain member's decoders of
// what a predecessor sends: the Forward message, then each entry as
// applyForwarded and appendLocked take it (the epoch header, the keys that
// mark it dirty for CRAQ reads, the shared FSM's command decoder). Nothing
// may panic, and two members applying the same entries must end identical.
// Seeds: badChainCommands and testdata/fuzz/FuzzChainEntries.
func FuzzChainEntries(f *testing.F) {
	for _, cmd := range badChainCommands() {
		e := append(binary.LittleEndian.AppendUint64(nil, 1), cmd...)
		b, err := proto.Marshal(&chainpb.Forward{Group: "t/0", Epoch: 1, FirstIndex: 1, Entries: [][]byte{e, e[:len(e)/2]}})
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	// Two members for the whole run (a table is costly to create), fed the
	// same entries in the same order.
	var fsms [2]*replication.FSM
	for i := range fsms {
		fsm, err := replication.NewFSM("t/0", reptest.SGDTable("t", 2), time.Hour)
		if err != nil {
			f.Fatal(err)
		}
		fsms[i] = fsm
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		msg := &chainpb.Forward{}
		if proto.Unmarshal(data, msg) != nil {
			return
		}
		for _, e := range msg.Entries {
			if len(e) < entryHeader {
				continue // applyForwarded refuses the message
			}
			_ = entryEpoch(e)
			keys := replication.PushedKeys(nil, e[entryHeader:], 2)
			ra, rb := fsms[0].ApplyCommand(e[entryHeader:]), fsms[1].ApplyCommand(e[entryHeader:])
			if (ra.Err() == nil) != (rb.Err() == nil) {
				t.Fatalf("members disagree: %v / %v", ra.Err(), rb.Err())
			}
			rows := [2][]float32{make([]float32, 2*len(keys)), make([]float32, 2*len(keys))}
			for i, fsm := range fsms {
				if err := fsm.Table().Lookup(keys, rows[i]); err != nil {
					t.Fatal(err)
				}
			}
			if !slices.Equal(rows[0], rows[1]) || fsms[0].Table().Len() != fsms[1].Table().Len() {
				t.Fatal("members diverged")
			}
		}
	})
}
