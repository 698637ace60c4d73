package replication

import (
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/raftps/raftps/replication/transportpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func randomAppend(rng *rand.Rand) *raft.AppendEntriesRequest {
	r := &raft.AppendEntriesRequest{
		RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: randBytes(rng, 5), Addr: randBytes(rng, 9)},
		Term:      rng.Uint64(), PrevLogEntry: rng.Uint64(), PrevLogTerm: rng.Uint64(),
		LeaderCommitIndex: rng.Uint64(),
	}
	//lint:ignore SA1019 the deprecated field still travels, so it is tested
	r.Leader = randBytes(rng, rng.IntN(2)*9)
	for i := range rng.IntN(5) {
		e := &raft.Log{Index: rng.Uint64(), Term: rng.Uint64(), Type: raft.LogType(i % 6),
			Data: randBytes(rng, rng.IntN(3)*rng.IntN(200)), Extensions: randBytes(rng, rng.IntN(2)*rng.IntN(5))}
		if rng.IntN(3) > 0 {
			e.AppendedAt = time.Unix(0, rng.Int64N(1<<62)-1<<61)
		}
		r.Entries = append(r.Entries, e)
	}
	return r
}

// sameAppend compares two requests as raft reads them: an empty byte
// field and a missing one are the same, and times are compared as instants.
func sameAppend(a, b *raft.AppendEntriesRequest) bool {
	norm := func(r *raft.AppendEntriesRequest) raft.AppendEntriesRequest {
		c := *r
		c.Entries = nil
		for _, e := range r.Entries {
			x := *e
			x.AppendedAt = time.Time{}
			if !e.AppendedAt.IsZero() {
				x.AppendedAt = time.Unix(0, e.AppendedAt.UnixNano())
			}
			for _, p := range []*[]byte{&x.Data, &x.Extensions} {
				if len(*p) == 0 {
					*p = nil
				}
			}
			c.Entries = append(c.Entries, &x)
		}
		//lint:ignore SA1019 the deprecated field still travels, so it is compared
		for _, p := range []*[]byte{&c.ID, &c.Addr, &c.Leader} {
			if len(*p) == 0 {
				*p = nil
			}
		}
		return c
	}
	return reflect.DeepEqual(norm(a), norm(b))
}

// TestAppendCodecRoundTrip: every field of an AppendEntriesRequest
// survives the binary encoding, as it survives msgpack
// (TestMessagesRoundTrip); every truncation and every trailing byte is an
// error, never a panic or a shorter request.
func TestAppendCodecRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for range 200 {
		want := randomAppend(rng)
		b := encodeAppend(nil, want)
		if len(b) > appendSize(want) {
			t.Fatalf("encoded %d bytes, more than the bound %d", len(b), appendSize(want))
		}
		var got raft.AppendEntriesRequest
		if err := decodeAppend(b, &got); err != nil {
			t.Fatal(err)
		}
		if !sameAppend(&got, want) {
			t.Fatalf("changed in transit:\n got %+v\nwant %+v", got, want)
		}
		// The same request, msgpack-encoded, decodes to the same thing.
		mp, err := encode(want)
		if err != nil {
			t.Fatal(err)
		}
		var viaMsgpack raft.AppendEntriesRequest
		if err := decode(mp, &viaMsgpack); err != nil {
			t.Fatal(err)
		}
		if !sameAppend(&got, &viaMsgpack) {
			t.Fatalf("binary and msgpack disagree:\n binary  %+v\n msgpack %+v", got, viaMsgpack)
		}
		for n := range len(b) {
			if err := decodeAppend(b[:n], &got); !errors.Is(err, errBadAppend) {
				t.Fatalf("cut to %d of %d bytes: err = %v", n, len(b), err)
			}
		}
		if err := decodeAppend(append(b, 0), &got); !errors.Is(err, errBadAppend) {
			t.Fatalf("a trailing byte: err = %v", err)
		}
	}
	// A count of entries the message cannot hold is refused before
	// anything is allocated for it.
	b := encodeAppend(nil, &raft.AppendEntriesRequest{})
	b = binary.AppendUvarint(b[:len(b)-1], 1<<60)
	var got raft.AppendEntriesRequest
	if err := decodeAppend(b, &got); !errors.Is(err, errBadAppend) {
		t.Fatalf("2^60 entries declared: err = %v", err)
	}
}

// FuzzDecodeAppend: no input panics the decoder, and what it accepts
// encodes back to the same bytes.
func FuzzDecodeAppend(f *testing.F) {
	rng := rand.New(rand.NewPCG(5, 6))
	for range 8 {
		f.Add(encodeAppend(nil, randomAppend(rng)))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var r raft.AppendEntriesRequest
		if decodeAppend(b, &r) != nil {
			return
		}
		var again raft.AppendEntriesRequest
		if err := decodeAppend(encodeAppend(nil, &r), &again); err != nil || !sameAppend(&r, &again) {
			t.Fatalf("accepted %x, but its re-encoding decodes to %+v (%v), not %+v", b, again, err, r)
		}
	})
}

// TestBinaryAppendsBesideAnOlderNode: two nodes that read binary appends
// and one that does not (MsgpackAppends, which also ignores the binary
// field as an older build would, so a binary append sent to it fails):
// each node leads the group in turn, entries are applied under each, and
// the replicas agree; the two newer nodes send each other binary appends,
// and the older one gets msgpack only.
func TestBinaryAppendsBesideAnOlderNode(t *testing.T) {
	nodes := []*testNode{startTestNode(t), startTestNode(t), startTestNodeWith(t, MuxConfig{MsgpackAppends: true})}
	reps, peers := startGroup(t, nodes, "g/0")
	var want uint64
	next := uint64(1)
	for round, target := range []int{0, 1, 2, 0} {
		l := waitLeader(t, reps)
		if l != reps[target] {
			if err := l.r.LeadershipTransferToServer(peers[target].ID, peers[target].Address).Error(); err != nil {
				t.Fatalf("round %d: transfer to node %d: %v", round, target, err)
			}
			if l = waitLeader(t, reps); l != reps[target] {
				t.Fatalf("round %d: node %d did not take over", round, target)
			}
		}
		var futures []raft.ApplyFuture
		for range 100 {
			futures = append(futures, l.r.Apply(binary.LittleEndian.AppendUint64(nil, next), 5*time.Second))
			want += next
			next++
		}
		for _, f := range futures {
			if err := f.Error(); err != nil {
				t.Fatalf("round %d (node %d leads): %v", round, target, err)
			}
		}
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		done := true
		for _, r := range reps {
			if sum, _ := r.fsm.state(); sum != want {
				done = false
			}
		}
		if done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the replicas did not converge")
		}
	}
	takes := func(from, to int) bool {
		v, ok := nodes[from].mux.heard.Load(raft.ServerAddress(nodes[to].addr))
		return ok && v.(*peerHeard).takesAppend.Load()
	}
	for _, n := range nodes[:2] {
		if n.mux.Stats().BinaryAppends.Load() == 0 {
			t.Errorf("node %s sent no binary append", n.addr)
		}
	}
	if !takes(0, 1) || !takes(1, 0) {
		t.Error("the two newer nodes did not learn that they read binary appends")
	}
	if takes(0, 2) || takes(1, 2) {
		t.Error("a newer node takes the older one to read binary appends")
	}
	if got := nodes[2].mux.Stats().BinaryAppends.Load(); got != 0 {
		t.Errorf("the older node sent %d binary appends", got)
	}
}

// TestAppendFailedForgetsOnlyARefusal: a binary append refused as
// undecodable (what an older build answers) makes the sender go back to
// msgpack for that peer; a failure that says nothing of the peer's build
// (it is down, the pipeline was closed) does not.
func TestAppendFailedForgetsOnlyARefusal(t *testing.T) {
	m := startTestNode(t).mux
	const peer = raft.ServerAddress("127.0.0.1:1")
	m.answered(peer, &transportpb.RPC{TakesAppend: true})
	binaryRPC := func() bool {
		in, err := m.appendRPC("g/0", peer, &raft.AppendEntriesRequest{Term: 1})
		if err != nil {
			t.Fatal(err)
		}
		return len(in.Append) > 0
	}
	if !binaryRPC() {
		t.Fatal("a peer whose answer takes binary appends gets msgpack")
	}
	sent := &transportpb.RPC{Append: []byte{appendCodecV1}}
	for _, err := range []error{status.Error(codes.Unavailable, "down"), status.Error(codes.Canceled, "closed"), errors.New("plain")} {
		m.appendFailed(peer, sent, err)
		if !binaryRPC() {
			t.Fatalf("after %v the peer gets msgpack", err)
		}
	}
	m.appendFailed(peer, sent, status.Error(codes.InvalidArgument, "raft transport: decoding"))
	if binaryRPC() {
		t.Fatal("after a refusal as undecodable the peer still gets binary appends")
	}
	m.answered(peer, &transportpb.RPC{TakesAppend: true})
	if !binaryRPC() {
		t.Fatal("an answer that takes binary appends did not bring them back")
	}
}
