package shard

import (
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/raftps/raftps/shard/internal/admission"
	"github.com/raftps/raftps/shard/shardpb"
)

// answerCodec is the client listener's codec: the admission codec, with
// pull answers marshalled around their values instead of through them.
//
// The proto codec copies a message's bytes fields into the buffer it
// marshals into; for a pull answer that is every row, a second copy after
// the table's own (and the answer's allocation, cleared, a third pass). A
// pull answer's Values instead come from gRPC's buffer pool (pullValues),
// and Marshal hands them to gRPC by reference, between the few bytes of
// tags and lengths it writes: gRPC frames them straight from there and
// returns them to the pool once written.
//
// Ownership: the Values of every PullResponse a handler returns, in a
// PullBatchResponse or alone, belong to this codec from the moment the
// handler returns them. Nothing may hold them after that; each is a buffer
// made for that answer (pullValues, or a make for the paths that are not
// hot). A Values slice that is not from the pool is safe to hand over: the
// pool keeps it for reuse if its capacity is one of its sizes.
type answerCodec struct {
	admission.Codec
}

func (c answerCodec) Marshal(v any) (mem.BufferSlice, error) {
	switch m := v.(type) {
	case *shardpb.PullBatchResponse:
		if len(m.ProtoReflect().GetUnknown()) == 0 {
			return marshalPullBatch(m, mem.DefaultBufferPool())
		}
	case *shardpb.PullResponse:
		if len(m.ProtoReflect().GetUnknown()) == 0 {
			return marshalPullAnswer(m, mem.DefaultBufferPool())
		}
	}
	return c.Codec.Marshal(v)
}

// pullValues is a buffer for n bytes of a pull answer's values, from the
// pool the codec hands them back to; its bytes are whatever the pool's
// last user left, so the reader must write every one (store.Table.Lookup
// does: a key with no row gets its initializer's values).
func pullValues(n int) []byte {
	return *mem.DefaultBufferPool().Get(n)
}

// marshalPullBatch writes resp as proto.Marshal would, in field order: the
// parts (field 1), then the errors (field 2).
func marshalPullBatch(resp *shardpb.PullBatchResponse, pool mem.BufferPool) (mem.BufferSlice, error) {
	var (
		meta []byte // tags, lengths, small fields: every byte but the values
		out  mem.BufferSlice
		from int // the start of meta's bytes not yet in out
	)
	for _, p := range resp.Parts {
		meta = protowire.AppendTag(meta, 1, protowire.BytesType)
		meta = protowire.AppendVarint(meta, uint64(proto.Size(p)))
		meta, out, from = appendPullAnswer(meta, out, from, p, pool)
	}
	for _, e := range resp.Errors {
		meta = protowire.AppendTag(meta, 2, protowire.BytesType)
		meta = protowire.AppendVarint(meta, uint64(proto.Size(e)))
		var err error
		if meta, err = (proto.MarshalOptions{UseCachedSize: true}).MarshalAppend(meta, e); err != nil {
			out.Free()
			return nil, err
		}
	}
	return flushMeta(out, meta, from), nil
}

// marshalPullAnswer writes one PullResponse (the Pull call's answer).
func marshalPullAnswer(p *shardpb.PullResponse, pool mem.BufferPool) (mem.BufferSlice, error) {
	meta, out, from := appendPullAnswer(nil, nil, 0, p, pool)
	return flushMeta(out, meta, from), nil
}

// appendPullAnswer writes p's fields in order: its values (field 1) into
// out by reference, after meta's pending bytes, then applied_index and
// served_by into meta. Empty fields are left out, as proto3 does.
func appendPullAnswer(meta []byte, out mem.BufferSlice, from int, p *shardpb.PullResponse, pool mem.BufferPool) ([]byte, mem.BufferSlice, int) {
	if len(p.Values) > 0 {
		meta = protowire.AppendTag(meta, 1, protowire.BytesType)
		meta = protowire.AppendVarint(meta, uint64(len(p.Values)))
		out = flushMeta(out, meta, from)
		from = len(meta)
		vals := p.Values
		out = append(out, mem.NewBuffer(&vals, pool))
		p.Values = nil // the codec's now (see answerCodec)
	}
	if p.AppliedIndex != 0 {
		meta = protowire.AppendTag(meta, 2, protowire.VarintType)
		meta = protowire.AppendVarint(meta, p.AppliedIndex)
	}
	if p.ServedBy != "" {
		meta = protowire.AppendTag(meta, 3, protowire.BytesType)
		meta = protowire.AppendString(meta, p.ServedBy)
	}
	return meta, out, from
}

// flushMeta appends meta[from:] to out. The slices out holds keep pointing
// into meta's array as it was then: later appends that grow meta copy it
// elsewhere and leave those bytes be.
func flushMeta(out mem.BufferSlice, meta []byte, from int) mem.BufferSlice {
	if len(meta) > from {
		out = append(out, mem.SliceBuffer(meta[from:len(meta):len(meta)]))
	}
	return out
}
