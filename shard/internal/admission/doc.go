// Package admission refuses a gRPC request whose decoding would cost far more
// memory than its bytes, before it is decoded.
//
// A protobuf message grows when decoded: an empty element of a repeated
// message field is two bytes on the wire and over a hundred in memory, so a
// 16 MiB PullBatch of empty parts would decode to over a gigabyte. The
// receive limit of a listener bounds the bytes; Codec bounds the elements.
// It walks the wire bytes along the message's descriptor (no allocation)
// and counts every element of a repeated field that is not packed (messages,
// bytes, strings, map entries), at every depth. A message with more than
// the codec's limit is not decoded at all; neither is one whose wire bytes
// are malformed.
//
// gRPC turns a codec's error into Internal, so the codec does not fail:
// it leaves the message empty and notes the refusal against the message's
// address. The interceptors (Unary, Stream), which run after the decode,
// take the note and answer with the error the caller's convert function
// makes of it (ResourceExhausted or InvalidArgument with the node's
// reason). A server must install the codec and both interceptors together,
// the interceptors first: ServerOptions does. Add other interceptors after
// them with grpc.ChainUnaryInterceptor, never with grpc.UnaryInterceptor,
// which gRPC runs before any chained one: an interceptor that answered a
// refused call without passing it on would leave its note behind.
//
// Concurrency: everything here is safe for concurrent use. The notes live
// in one sync.Map; each is taken by the interceptor of the call that made
// it, in the same goroutine, right after the decode.
package admission
