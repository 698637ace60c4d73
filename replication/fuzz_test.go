package replication

import (
	"bytes"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/raftps/raftps/replication/internal/reptest"
)

// FuzzApplyCommand feeds arbitrary bytes to the state machine's command
// decoder as a committed entry of a table of dim 2. It must not panic; a
// refused entry (ErrBadEntry) must leave the state as it was; two replicas
// applying the same bytes must end identical; and PushedKeys must list the
// keys of exactly the pushes an accepted entry held. Seeds: badCommands and
// testdata/fuzz/FuzzApplyCommand (the reproductions of issue 22).
func FuzzApplyCommand(f *testing.F) {
	for _, bc := range badCommands() {
		f.Add(bc.cmd)
	}
	f.Add(encodePushBatch(1, []*Push{{Client: 1, Seq: 1, Keys: []uint64{1}, Grads: []float32{1, 2}}}))
	f.Add(encodePushBatch(1, []*Push{{Client: 1, Seq: 1, Keys: []uint64{1}, Grads: []float32{1, 2}, BF16: true}}))
	f.Add([]byte{cmdNoop})
	// Two replicas for the whole run (a table is costly to create), fed
	// the same inputs in the same order: they must stay identical.
	var fsms [2]*FSM
	for i := range fsms {
		fsm, err := NewFSM("g", reptest.SGDTable("t", 2), time.Hour)
		if err != nil {
			f.Fatal(err)
		}
		if res := fsm.ApplyCommand(encodePushBatch(1, []*Push{{Client: 1, Seq: 1, Keys: []uint64{1, 2}, Grads: []float32{1, 2, 3, 4}}})); res.Err() != nil {
			f.Fatal(res.Err())
		}
		fsms[i] = fsm
	}
	f.Fuzz(func(t *testing.T, cmd []byte) {
		a, b := fsms[0], fsms[1]
		// Table checksums cost a pass over the arena: the rows an entry can
		// touch are compared instead, with the row count and dedupe record.
		keys := append(PushedKeys(nil, cmd, 2), 1, 2)
		rows := func(f *FSM) []float32 {
			out := make([]float32, len(keys)*2)
			if err := f.Table().Lookup(keys, out); err != nil {
				t.Fatal(err)
			}
			return out
		}
		before, dd, n := rows(a), a.dd.appendTo(nil), a.Table().Len()
		ra, rb := a.ApplyCommand(cmd), b.ApplyCommand(cmd)
		if (ra.Err() == nil) != (rb.Err() == nil) || len(ra.outcomes) != len(rb.outcomes) {
			t.Fatalf("replicas disagree: %v / %v", ra.Err(), rb.Err())
		}
		after := rows(a)
		if !slices.Equal(after, rows(b)) || a.Table().Len() != b.Table().Len() || !bytes.Equal(a.dd.appendTo(nil), b.dd.appendTo(nil)) {
			t.Fatal("replicas diverged")
		}
		if ra.Err() != nil {
			if !errors.Is(ra.Err(), ErrBadEntry) || len(ra.outcomes) != 0 {
				t.Fatalf("refused with %v and %d outcomes", ra.Err(), len(ra.outcomes))
			}
			if !slices.Equal(after, before) || a.Table().Len() != n || !bytes.Equal(a.dd.appendTo(nil), dd) {
				t.Fatal("a refused entry changed the state")
			}
		}
	})
}

// FuzzRaftDecode feeds arbitrary bytes to the Raft transport's decoder (the
// msgpack payload of every Raft RPC a peer listener receives), as each
// request type the transport serves. It must not panic.
func FuzzRaftDecode(f *testing.F) {
	ae, _ := encode(&raft.AppendEntriesRequest{RPCHeader: raft.RPCHeader{ID: []byte("n1"), Addr: []byte("a")}, Term: 3, Entries: []*raft.Log{{Index: 1, Term: 1, Data: []byte{cmdNoop}}}})
	rv, _ := encode(&raft.RequestVoteRequest{Term: 2, LastLogIndex: 5})
	is, _ := encode(&raft.InstallSnapshotRequest{Size: 1 << 40, Configuration: []byte{1, 2}})
	for i, seed := range [][]byte{ae, rv, is, {0xdd, 0xff, 0xff, 0xff, 0xff}, {0xdf, 0x7f, 0xff, 0xff, 0xff}} {
		f.Add(byte(i), seed)
	}
	f.Fuzz(func(t *testing.T, kind byte, b []byte) {
		var v any
		switch kind % 6 {
		case 0:
			v = &raft.AppendEntriesRequest{}
		case 1:
			v = &raft.RequestVoteRequest{}
		case 2:
			v = &raft.RequestPreVoteRequest{}
		case 3:
			v = &raft.TimeoutNowRequest{}
		case 4:
			v = &raft.InstallSnapshotRequest{}
		default:
			v = &raft.AppendEntriesResponse{}
		}
		_ = decode(b, v) // an error is the refusal; a panic is the bug
	})
}
