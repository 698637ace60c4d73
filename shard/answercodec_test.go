package shard

import (
	"bytes"
	"math/rand/v2"
	"slices"
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/raftps/raftps/shard/internal/admission"
	"github.com/raftps/raftps/shard/shardpb"
)

// countingPool hands out fresh buffers and counts those given back.
type countingPool struct{ put [][]byte }

func (p *countingPool) Get(n int) *[]byte { b := make([]byte, n); return &b }
func (p *countingPool) Put(b *[]byte)     { p.put = append(p.put, *b) }

func randomPullAnswer(r *rand.Rand) *shardpb.PullResponse {
	// Sizes on both sides of gRPC's pooling threshold (1 KiB), and none.
	v := make([]byte, 4*[]int{0, 1, 64, 300, 4096}[r.IntN(5)])
	for i := range v {
		v[i] = byte(r.Uint32())
	}
	p := &shardpb.PullResponse{Values: v}
	if r.IntN(2) == 0 {
		p.AppliedIndex = r.Uint64() >> r.IntN(64)
	}
	if r.IntN(2) == 0 {
		p.ServedBy = roleNames[r.IntN(len(roleNames))]
	}
	return p
}

// TestAnswerCodecMatchesProto: pull answers marshalled around their values
// are byte for byte what the proto codec writes, alone and in batches with
// errors; their values are not copied (each goes out as its own buffer),
// and each pooled one goes back to the pool once gRPC frees what it wrote.
func TestAnswerCodecMatchesProto(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	codec := answerCodec{admission.Codec{Limit: 100, What: "parts"}}
	for i := range 200 {
		batch := &shardpb.PullBatchResponse{}
		for range r.IntN(6) {
			batch.Parts = append(batch.Parts, randomPullAnswer(r))
			e := &shardpb.PartError{}
			if r.IntN(3) == 0 {
				e = &shardpb.PartError{Code: 14, Message: "not leader", Info: &shardpb.ErrorInfo{}}
			}
			batch.Errors = append(batch.Errors, e)
		}
		msgs := []proto.Message{batch, randomPullAnswer(r)}
		for _, m := range msgs {
			want, err := proto.Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			var values [][]byte
			var pooled int
			switch m := m.(type) {
			case *shardpb.PullBatchResponse:
				for _, p := range m.Parts {
					values = append(values, p.Values)
				}
			case *shardpb.PullResponse:
				values = append(values, m.Values)
			}
			pool := &countingPool{}
			var out mem.BufferSlice
			switch m := m.(type) {
			case *shardpb.PullBatchResponse:
				out, err = marshalPullBatch(m, pool)
			case *shardpb.PullResponse:
				out, err = marshalPullAnswer(m, pool)
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := out.Materialize(); !bytes.Equal(got, want) {
				t.Fatalf("message %d (%T): marshalled %x, proto.Marshal %x", i, m, got, want)
			}
			// Every non-empty value slice is one of out's buffers, as it
			// was: by reference.
			for _, v := range values {
				if len(v) == 0 {
					continue
				}
				if len(v) >= 1024 {
					pooled++
				}
				if !slices.ContainsFunc(out, func(b mem.Buffer) bool {
					d := b.ReadOnlyData()
					return len(d) == len(v) && &d[0] == &v[0]
				}) {
					t.Fatalf("message %d: a part's %d values were copied", i, len(v))
				}
			}
			out.Free()
			if len(pool.put) != pooled {
				t.Fatalf("message %d: %d buffers back in the pool, want %d (the values of 1 KiB or more)", i, len(pool.put), pooled)
			}
		}
		// Through the codec (gRPC's pool), the same bytes again.
		b2 := &shardpb.PullBatchResponse{Parts: []*shardpb.PullResponse{randomPullAnswer(r)}, Errors: []*shardpb.PartError{{}}}
		want, _ := proto.Marshal(b2)
		out, err := codec.Marshal(b2)
		if err != nil {
			t.Fatal(err)
		}
		if got := out.Materialize(); !bytes.Equal(got, want) {
			t.Fatalf("through the codec: %x, want %x", got, want)
		}
		out.Free()
	}
	// Any other message, and an answer with unknown fields, go through the
	// proto codec.
	odd := &shardpb.PullResponse{Values: []byte{1, 2, 3, 4}}
	odd.ProtoReflect().SetUnknown(protoreflect.RawFields{0x48, 0x01}) // field 9, varint 1
	for _, m := range []proto.Message{&shardpb.PartError{Code: 3, Message: "x"}, odd} {
		want, _ := proto.Marshal(m)
		out, err := codec.Marshal(m)
		if err != nil || !bytes.Equal(out.Materialize(), want) {
			t.Fatalf("%T through the codec: %x, %v; want %x", m, out.Materialize(), err, want)
		}
	}
}

// TestAnswerCodecKnowsEveryField: the codec writes the fields it knows of
// a pull answer; a field added to one must be added to it too, or answers
// would lose it without a word.
func TestAnswerCodecKnowsEveryField(t *testing.T) {
	for _, c := range []struct {
		m     proto.Message
		known []string
	}{
		{&shardpb.PullResponse{}, []string{"values", "applied_index", "served_by"}},
		{&shardpb.PullBatchResponse{}, []string{"parts", "errors"}},
	} {
		fields := c.m.ProtoReflect().Descriptor().Fields()
		var names []string
		for i := range fields.Len() {
			names = append(names, string(fields.Get(i).Name()))
		}
		if !slices.Equal(names, c.known) {
			t.Errorf("%T has fields %v; answercodec.go writes %v: teach it the new ones", c.m, names, c.known)
		}
	}
}
