package client

import (
	"errors"
	"fmt"
	"sync"
	"unicode/utf8"

	"google.golang.org/grpc/encoding"
	_ "google.golang.org/grpc/encoding/proto" // registers the "proto" codec
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/raftps/raftps/shard/shardpb"
)

var protoCodec = encoding.GetCodecV2("proto")

// errMalformedAnswer: a PullBatchResponse whose wire bytes do not parse.
var errMalformedAnswer = errors.New("malformed pull batch answer")

// pullAnswer is the codec of one PullBatch call (grpc.ForceCodecV2): it
// decodes the answer with each part's Values pointing into the received
// message, not copied out of it, and keeps that message (msg) until the
// pull has copied the rows into the caller's buffer. The proto codec
// copied every value twice, into one buffer and then into a new slice per
// part, a fifth of a pulling client's CPU with the allocations.
type pullAnswer struct {
	msg mem.Buffer // nil until Unmarshal succeeds
}

// Name is "proto": the server decodes and encodes as for any other call.
func (*pullAnswer) Name() string { return "proto" }

func (*pullAnswer) Marshal(v any) (mem.BufferSlice, error) { return protoCodec.Marshal(v) }

func (a *pullAnswer) Unmarshal(data mem.BufferSlice, v any) error {
	resp, ok := v.(*shardpb.PullBatchResponse)
	if !ok {
		return protoCodec.Unmarshal(data, v)
	}
	// One buffer as it came, or the frames' buffers copied into one.
	msg := data.MaterializeToBuffer(mem.DefaultBufferPool())
	if err := decodePullBatch(msg.ReadOnlyData(), resp); err != nil {
		msg.Free()
		return err
	}
	if a.msg != nil {
		a.msg.Free()
	}
	a.msg = msg
	return nil
}

// decodePullBatch decodes b into resp as proto.Unmarshal would, except that
// each part's Values aliases b. Unknown fields are skipped.
func decodePullBatch(b []byte, resp *shardpb.PullBatchResponse) error {
	proto.Reset(resp)
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return fmt.Errorf("%w: %v", errMalformedAnswer, protowire.ParseError(n))
		}
		b = b[n:]
		if typ != protowire.BytesType || (num != 1 && num != 2) {
			if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
				return fmt.Errorf("%w: field %d: %v", errMalformedAnswer, num, protowire.ParseError(n))
			}
			b = b[n:]
			continue
		}
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return fmt.Errorf("%w: field %d: %v", errMalformedAnswer, num, protowire.ParseError(n))
		}
		b = b[n:]
		if num == 2 {
			pe := new(shardpb.PartError)
			if err := proto.Unmarshal(v, pe); err != nil {
				return fmt.Errorf("%w: part error: %v", errMalformedAnswer, err)
			}
			resp.Errors = append(resp.Errors, pe)
			continue
		}
		part, err := decodePullPart(v)
		if err != nil {
			return err
		}
		resp.Parts = append(resp.Parts, part)
	}
	return nil
}

// decodePullPart decodes one PullResponse, its Values aliasing b.
func decodePullPart(b []byte) (*shardpb.PullResponse, error) {
	part := new(shardpb.PullResponse)
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, fmt.Errorf("%w: part: %v", errMalformedAnswer, protowire.ParseError(n))
		}
		b = b[n:]
		switch {
		case num == 1 && typ == protowire.BytesType:
			part.Values, n = protowire.ConsumeBytes(b)
			if part.Values == nil && n >= 0 {
				part.Values = []byte{} // present, as proto.Unmarshal leaves it
			}
		case num == 2 && typ == protowire.VarintType:
			part.AppliedIndex, n = protowire.ConsumeVarint(b)
		case num == 3 && typ == protowire.BytesType:
			var s []byte
			if s, n = protowire.ConsumeBytes(b); n >= 0 {
				if !utf8.Valid(s) {
					// A proto3 string, which proto.Unmarshal refuses so.
					return nil, fmt.Errorf("%w: served_by is not UTF-8", errMalformedAnswer)
				}
				part.ServedBy = string(s)
			}
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return nil, fmt.Errorf("%w: part field %d: %v", errMalformedAnswer, num, protowire.ParseError(n))
		}
		b = b[n:]
	}
	return part, nil
}

// answers holds the messages a pull's placed parts point into, until the
// pull has copied its rows out (release). A call answered after that (a
// hedge's loser) frees its message at once.
type answers struct {
	mu       sync.Mutex
	held     []mem.Buffer
	released bool
}

// keep takes over msg: held if the pull still reads from it, else freed.
func (h *answers) keep(msg mem.Buffer, placed bool) {
	if msg == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if !placed || h.released {
		msg.Free()
		return
	}
	h.held = append(h.held, msg)
}

// release frees every held message: nothing reads from them after it.
func (h *answers) release() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.released = true
	for _, m := range h.held {
		m.Free()
	}
	h.held = nil
}
