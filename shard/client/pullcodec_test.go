package client

import (
	"errors"
	"math/rand/v2"
	"testing"
	"unsafe"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/raftps/raftps/shard/shardpb"
)

func randomPullBatch(r *rand.Rand) *shardpb.PullBatchResponse {
	resp := &shardpb.PullBatchResponse{}
	for range r.IntN(5) {
		v := make([]byte, 4*r.IntN(300))
		for i := range v {
			v[i] = byte(r.Uint32())
		}
		p := &shardpb.PullResponse{Values: v, AppliedIndex: r.Uint64() >> r.IntN(64)}
		if r.IntN(2) == 0 {
			p.ServedBy = []string{"leader", "follower", "read-replica"}[r.IntN(3)]
		}
		resp.Parts = append(resp.Parts, p)
		e := &shardpb.PartError{}
		if r.IntN(3) == 0 {
			e = &shardpb.PartError{Code: uint32(r.IntN(16)), Message: "no leader"}
		}
		resp.Errors = append(resp.Errors, e)
	}
	return resp
}

// TestDecodePullBatch: the answer decoded with values in place equals what
// proto.Unmarshal makes of the same bytes, for random answers and with
// fields the decoder does not know (a newer server's) among them; each
// part's Values points into the message, not into a copy; and every
// truncation of a message either decodes as proto.Unmarshal does or is
// refused as malformed, never a panic.
func TestDecodePullBatch(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for i := range 300 {
		want := randomPullBatch(r)
		b, err := proto.Marshal(want)
		if err != nil {
			t.Fatal(err)
		}
		if i%3 == 0 {
			// Unknown fields at both levels: a varint 9 in the answer and
			// a fixed64 7 in a part.
			b = protowire.AppendVarint(protowire.AppendTag(b, 9, protowire.VarintType), 42)
			part := protowire.AppendFixed64(protowire.AppendTag(nil, 7, protowire.Fixed64Type), 1)
			b = protowire.AppendBytes(protowire.AppendTag(b, 1, protowire.BytesType), part)
			want.Parts = append(want.Parts, &shardpb.PullResponse{})
		}
		got := &shardpb.PullBatchResponse{Parts: []*shardpb.PullResponse{{Values: []byte("stale")}}}
		if err := decodePullBatch(b, got); err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		ref := &shardpb.PullBatchResponse{}
		if err := proto.Unmarshal(b, ref); err != nil {
			t.Fatal(err)
		}
		for _, m := range []*shardpb.PullBatchResponse{got, ref} {
			m.ProtoReflect().SetUnknown(nil)
			for _, p := range m.Parts {
				p.ProtoReflect().SetUnknown(nil)
			}
		}
		if !proto.Equal(got, ref) || !proto.Equal(got, want) {
			t.Fatalf("message %d: decoded %v, proto.Unmarshal %v, sent %v", i, got, ref, want)
		}
		start, end := uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(unsafe.Pointer(unsafe.SliceData(b)))+uintptr(len(b))
		for _, p := range got.Parts {
			if len(p.Values) > 0 {
				if a := uintptr(unsafe.Pointer(unsafe.SliceData(p.Values))); a < start || a >= end {
					t.Fatalf("message %d: a part's values were copied out of the message", i)
				}
			}
		}
		for cut := range len(b) {
			err := decodePullBatch(b[:cut], &shardpb.PullBatchResponse{})
			if refErr := proto.Unmarshal(b[:cut], &shardpb.PullBatchResponse{}); (err == nil) != (refErr == nil) {
				t.Fatalf("message %d cut at %d: decode says %v, proto.Unmarshal %v", i, cut, err, refErr)
			}
			if err != nil && !errors.Is(err, errMalformedAnswer) {
				t.Fatalf("message %d cut at %d: %v, want errMalformedAnswer", i, cut, err)
			}
		}
	}
}

// countingPool counts what is handed back to it.
type countingPool struct{ put int }

func (p *countingPool) Get(n int) *[]byte { b := make([]byte, n); return &b }
func (p *countingPool) Put(*[]byte)       { p.put++ }

// TestAnswersHeld: a message some part points into is freed only by
// release; one no part was placed from, or one kept after release (a
// hedge answering after the pull finished), is freed at once.
func TestAnswersHeld(t *testing.T) {
	pool := &countingPool{}
	msg := func() mem.Buffer { return mem.NewBuffer(pool.Get(4096), pool) }
	var h answers
	h.keep(msg(), true)
	h.keep(msg(), true)
	h.keep(msg(), false)
	h.keep(nil, true)
	if pool.put != 1 {
		t.Fatalf("%d messages freed before release, want 1 (the one no part was placed from)", pool.put)
	}
	h.release()
	if pool.put != 3 {
		t.Fatalf("%d messages freed after release, want 3", pool.put)
	}
	h.keep(msg(), true)
	if pool.put != 4 {
		t.Fatalf("a message kept after release was not freed")
	}
}

// TestPullAnswerCodec: through the codec, a PullBatchResponse is decoded in
// place and its message held; any other message goes to the proto codec.
func TestPullAnswerCodec(t *testing.T) {
	want := &shardpb.PullBatchResponse{Parts: []*shardpb.PullResponse{{Values: []byte{1, 2, 3, 4}, ServedBy: "leader"}}, Errors: []*shardpb.PartError{{}}}
	b, _ := proto.Marshal(want)
	// Two buffers, as a message in two frames arrives.
	data := mem.BufferSlice{mem.SliceBuffer(b[:3]), mem.SliceBuffer(b[3:])}
	c := new(pullAnswer)
	got := new(shardpb.PullBatchResponse)
	if err := c.Unmarshal(data, got); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(got, want) || c.msg == nil {
		t.Fatalf("decoded %v (message held: %v), want %v", got, c.msg != nil, want)
	}
	status := &shardpb.PartError{Code: 5, Message: "x"}
	sb, _ := proto.Marshal(status)
	gotStatus := new(shardpb.PartError)
	if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(sb)}, gotStatus); err != nil || !proto.Equal(gotStatus, status) {
		t.Fatalf("another message through the codec: %v, %v", gotStatus, err)
	}
	if err := new(pullAnswer).Unmarshal(mem.BufferSlice{mem.SliceBuffer([]byte{0x0a, 0x05})}, new(shardpb.PullBatchResponse)); !errors.Is(err, errMalformedAnswer) {
		t.Fatalf("a truncated answer: %v, want errMalformedAnswer", err)
	}
	// served_by is a proto3 string: not UTF-8, refused as proto refuses it.
	part := protowire.AppendString(protowire.AppendTag(nil, 3, protowire.BytesType), "\xff")
	bad := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), part)
	if proto.Unmarshal(bad, new(shardpb.PullBatchResponse)) == nil {
		t.Fatal("proto.Unmarshal took a served_by that is not UTF-8; the test's premise is wrong")
	}
	if err := new(pullAnswer).Unmarshal(mem.BufferSlice{mem.SliceBuffer(bad)}, new(shardpb.PullBatchResponse)); !errors.Is(err, errMalformedAnswer) {
		t.Fatalf("served_by not UTF-8: %v, want errMalformedAnswer", err)
	}
}

// BenchmarkPullAnswer: a 1 MiB PullBatch answer (4 parts of 1024 rows of
// 256 bytes) arriving in 16 KiB frames, decoded and its rows copied into a
// caller's buffer in a shuffled order, as a pull does: with the proto codec
// (the frames joined, then unmarshalled, which copies each part's values),
// and as pullAnswer does (the frames joined, the values left in place).
// Answers are taken in turn from 64 copies, so that their bytes are not in
// the CPU's caches when decoded, as when they come from the kernel.
func BenchmarkPullAnswer(b *testing.B) {
	const parts, rows, rowBytes = 4, 1024, 256
	resp := &shardpb.PullBatchResponse{}
	for range parts {
		resp.Parts = append(resp.Parts, &shardpb.PullResponse{Values: make([]byte, rows*rowBytes), ServedBy: "leader"})
		resp.Errors = append(resp.Errors, &shardpb.PartError{})
	}
	wire, _ := proto.Marshal(resp)
	var answers [64]mem.BufferSlice
	for a := range answers {
		for w := append([]byte(nil), wire...); len(w) > 0; {
			n := min(len(w), 16<<10)
			answers[a] = append(answers[a], mem.SliceBuffer(w[:n:n]))
			w = w[n:]
		}
	}
	order := rand.New(rand.NewPCG(1, 2)).Perm(parts * rows)
	out := make([]byte, parts*rows*rowBytes)
	scatter := func(values func(p int) []byte) {
		for i, k := range order {
			p, j := k/rows, k%rows
			copy(out[i*rowBytes:(i+1)*rowBytes], values(p)[j*rowBytes:(j+1)*rowBytes])
		}
	}
	b.Run("codec=proto", func(b *testing.B) {
		b.SetBytes(int64(len(out)))
		for i := 0; b.Loop(); i++ {
			got := new(shardpb.PullBatchResponse)
			if err := protoCodec.Unmarshal(answers[i%len(answers)], got); err != nil {
				b.Fatal(err)
			}
			scatter(func(p int) []byte { return got.Parts[p].Values })
		}
	})
	b.Run("codec=pullAnswer", func(b *testing.B) {
		b.SetBytes(int64(len(out)))
		for i := 0; b.Loop(); i++ {
			c, got := new(pullAnswer), new(shardpb.PullBatchResponse)
			if err := c.Unmarshal(answers[i%len(answers)], got); err != nil {
				b.Fatal(err)
			}
			scatter(func(p int) []byte { return got.Parts[p].Values })
			c.msg.Free()
		}
	})
}
