package admission

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	_ "google.golang.org/grpc/encoding/proto" // registers the "proto" codec Codec marshals with
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// Errors of a refused message. Callers map them to their wire errors.
var (
	// ErrTooManyElements: the message holds more repeated elements than the
	// codec's limit.
	ErrTooManyElements = errors.New("too many repeated elements")
	// ErrMalformed: the message's wire bytes do not parse.
	ErrMalformed = errors.New("malformed message")
)

// maxDepth bounds how deep the scan follows nested messages; none of the
// protocol's messages nests more than a few levels.
const maxDepth = 64

// Codec is the "proto" codec with the element count checked first.
type Codec struct {
	// Limit is the most repeated elements one message may hold, all depths
	// together; What names it in the refusal (e.g. "parts per batch").
	Limit int
	What  string
}

var protoCodec = encoding.GetCodecV2("proto")

// Name is "proto", so that clients need nothing special.
func (Codec) Name() string { return "proto" }

// Marshal is the proto codec's.
func (Codec) Marshal(v any) (mem.BufferSlice, error) { return protoCodec.Marshal(v) }

// Unmarshal decodes data into v unless the scan refuses it; then v stays
// empty and the refusal is noted for the interceptors (see the package
// doc). It fails only for a v that is not a proto.Message.
func (c Codec) Unmarshal(data mem.BufferSlice, v any) error {
	m, ok := v.(proto.Message)
	if !ok {
		return fmt.Errorf("admission codec: %T is not a proto.Message", v)
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	b := buf.ReadOnlyData()
	md := m.ProtoReflect().Descriptor()
	budget := c.Limit
	if err := scan(b, md, &budget, 0); err != nil {
		notes.Store(v, c.refusal(md, err))
		return nil
	}
	if err := proto.Unmarshal(b, m); err != nil {
		proto.Reset(m)
		notes.Store(v, fmt.Errorf("%s: %w: %v", md.FullName(), ErrMalformed, err))
	}
	return nil
}

func (c Codec) refusal(md protoreflect.MessageDescriptor, err error) error {
	if errors.Is(err, ErrTooManyElements) {
		return fmt.Errorf("%s: %w: more than %d; the limit is %d %s", md.FullName(), ErrTooManyElements, c.Limit, c.Limit, c.What)
	}
	return fmt.Errorf("%s: %w", md.FullName(), err)
}

// Check runs the codec's scan on a message's wire bytes: nil, or the error
// Unmarshal would note. For tests and fuzzing.
func (c Codec) Check(b []byte, md protoreflect.MessageDescriptor) error {
	budget := c.Limit
	if err := scan(b, md, &budget, 0); err != nil {
		return c.refusal(md, err)
	}
	return nil
}

// scan walks b, the wire bytes of a message of type md, taking one from
// budget for every element of a repeated field that is not packed, and
// fails once budget is below zero or b does not parse. Packed scalars cost
// no more decoded than on the wire, and unknown fields are kept as one
// byte slice, so neither counts.
func scan(b []byte, md protoreflect.MessageDescriptor, budget *int, depth int) error {
	if depth > maxDepth {
		return fmt.Errorf("%w: nested deeper than %d", ErrMalformed, maxDepth)
	}
	fields := md.Fields()
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return fmt.Errorf("%w: %v", ErrMalformed, protowire.ParseError(n))
		}
		b = b[n:]
		fd := fields.ByNumber(num)
		var val []byte
		if typ == protowire.BytesType {
			val, n = protowire.ConsumeBytes(b)
		} else {
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return fmt.Errorf("%w: field %d: %v", ErrMalformed, num, protowire.ParseError(n))
		}
		b = b[n:]
		if fd == nil {
			continue
		}
		packed := typ == protowire.BytesType && fd.Kind() != protoreflect.MessageKind &&
			fd.Kind() != protoreflect.BytesKind && fd.Kind() != protoreflect.StringKind
		if fd.Cardinality() == protoreflect.Repeated && !packed {
			if *budget--; *budget < 0 {
				return ErrTooManyElements
			}
		}
		if fd.Kind() == protoreflect.MessageKind && typ == protowire.BytesType {
			if err := scan(val, fd.Message(), budget, depth+1); err != nil {
				return err
			}
		}
	}
	return nil
}

// notes holds the refusals Unmarshal noted, by message address.
var notes sync.Map

// Take returns the refusal noted for msg, removing it, or nil.
func Take(msg any) error {
	if err, ok := notes.LoadAndDelete(msg); ok {
		return err.(error)
	}
	return nil
}

// Unary answers a request the codec refused with convert(refusal).
func Unary(convert func(error) error) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if err := Take(req); err != nil {
			return nil, convert(err)
		}
		return handler(ctx, req)
	}
}

// Stream ends a stream whose message the codec refused with
// convert(refusal).
func Stream(convert func(error) error) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		return handler(srv, &checkedStream{ServerStream: ss, convert: convert})
	}
}

type checkedStream struct {
	grpc.ServerStream
	convert func(error) error
}

func (s *checkedStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	if err := Take(m); err != nil {
		return s.convert(err)
	}
	return nil
}

// ServerOptions are the codec and its interceptors for a server: give
// them before any other interceptor, so that none sees a refused
// (empty) message. c is a Codec, or a codec that embeds one and marshals
// some messages its own way (its Unmarshal must be the Codec's).
func ServerOptions(c encoding.CodecV2, convert func(error) error) []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ForceServerCodecV2(c),
		grpc.ChainUnaryInterceptor(Unary(convert)),
		grpc.ChainStreamInterceptor(Stream(convert)),
	}
}
