package replication

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/hashicorp/raft"
	"github.com/raftps/raftps/replication/transportpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// A binary encoding of raft.AppendEntriesRequest, for the transport.
//
// Every other Raft message crosses the transport msgpack-encoded, as
// hashicorp/raft's NetworkTransport sends it. An append carries the log
// entries, and msgpack walks them by reflection and copies each entry's
// data once to encode and once to decode: 8 % of a node's CPU under pushes
// (docs/BENCHMARKS.md, "A binary codec for appends"). This encoding writes
// the fixed fields as varints and each entry's data as one copy, and its
// decoder points the entries' Data and Extensions into the message
// instead of copying them (the message is the receiver's own: protobuf
// unmarshalled it into a fresh slice).
//
// A node reads it only if it says so: every transport answer from a build
// that reads it has RPC.takes_append set, and a sender uses the encoding to
// a peer only after such an answer from it, so a node of an older build
// (which would take an RPC without msgpack for an empty request) keeps
// getting msgpack.
//
//	version 1 | protocol version uvarint | id bytes | addr bytes | term uvarint
//	| leader bytes | prev index uvarint | prev term uvarint | commit uvarint
//	| entries uvarint | entries × (index uvarint | term uvarint | type u8
//	| appended-at varint (unix ns, 0: none) | data bytes | extensions bytes)
//
// where "bytes" is a uvarint length and that many bytes.
const appendCodecV1 = 1

// errBadAppend wraps every decoding failure.
var errBadAppend = errors.New("bad binary append")

// appendSize is an upper bound of what encodeAppend writes for r.
func appendSize(r *raft.AppendEntriesRequest) int {
	const v = binary.MaxVarintLen64
	// The version byte, six numbers and three lengths; per entry, three
	// numbers, the type byte and two lengths.
	//lint:ignore SA1019 the deprecated field Raft still reads (transport_auth.go)
	n := 1 + 9*v + len(r.ID) + len(r.Addr) + len(r.Leader)
	for _, e := range r.Entries {
		n += 5*v + 1 + len(e.Data) + len(e.Extensions)
	}
	return n
}

func appendBytes(b, v []byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(v)))
	return append(b, v...)
}

// encodeAppend appends r's binary encoding to b.
func encodeAppend(b []byte, r *raft.AppendEntriesRequest) []byte {
	b = slices.Grow(b, appendSize(r))
	b = append(b, appendCodecV1)
	b = binary.AppendUvarint(b, uint64(r.ProtocolVersion))
	b = appendBytes(b, r.ID)
	b = appendBytes(b, r.Addr)
	b = binary.AppendUvarint(b, r.Term)
	//lint:ignore SA1019 the deprecated field Raft still reads (transport_auth.go)
	b = appendBytes(b, r.Leader)
	b = binary.AppendUvarint(b, r.PrevLogEntry)
	b = binary.AppendUvarint(b, r.PrevLogTerm)
	b = binary.AppendUvarint(b, r.LeaderCommitIndex)
	b = binary.AppendUvarint(b, uint64(len(r.Entries)))
	for _, e := range r.Entries {
		b = binary.AppendUvarint(b, e.Index)
		b = binary.AppendUvarint(b, e.Term)
		b = append(b, byte(e.Type))
		var ns int64
		if !e.AppendedAt.IsZero() {
			ns = e.AppendedAt.UnixNano()
		}
		b = binary.AppendVarint(b, ns)
		b = appendBytes(b, e.Data)
		b = appendBytes(b, e.Extensions)
	}
	return b
}

// appendReader walks an encoded append, remembering the first failure.
type appendReader struct {
	b   []byte
	err error
}

func (r *appendReader) fail(what string) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: %s at byte %d", errBadAppend, what, len(r.b))
	}
}

func (r *appendReader) uvarint(what string) uint64 {
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.fail(what)
		return 0
	}
	r.b = r.b[n:]
	return v
}

// varint reads what binary.AppendVarint wrote: a zig-zag uvarint.
func (r *appendReader) varint(what string) int64 {
	u := r.uvarint(what)
	return int64(u>>1) ^ -int64(u&1)
}

// bytes returns the next length-prefixed run, nil when empty, pointing
// into the message (capped, so an append to it cannot write past it).
func (r *appendReader) bytes(what string) []byte {
	n := r.uvarint(what)
	if r.err != nil {
		return nil
	}
	if n > uint64(len(r.b)) {
		r.fail(what + " overruns the message")
		return nil
	}
	v := r.b[:n:n]
	r.b = r.b[n:]
	if n == 0 {
		return nil
	}
	return v
}

// decodeAppend decodes b into out. The entries' Data and Extensions point
// into b, which the caller must not reuse.
func decodeAppend(b []byte, out *raft.AppendEntriesRequest) error {
	if len(b) == 0 || b[0] != appendCodecV1 {
		return fmt.Errorf("%w: unknown version", errBadAppend)
	}
	r := appendReader{b: b[1:]}
	*out = raft.AppendEntriesRequest{}
	out.ProtocolVersion = raft.ProtocolVersion(r.uvarint("protocol version"))
	out.ID = r.bytes("id")
	out.Addr = r.bytes("addr")
	out.Term = r.uvarint("term")
	//lint:ignore SA1019 the deprecated field Raft still reads (transport_auth.go)
	out.Leader = r.bytes("leader")
	out.PrevLogEntry = r.uvarint("previous index")
	out.PrevLogTerm = r.uvarint("previous term")
	out.LeaderCommitIndex = r.uvarint("commit index")
	n := r.uvarint("entry count")
	if r.err != nil {
		return r.err
	}
	// Every entry takes at least 6 bytes: a count the message cannot hold
	// is refused before anything is sized by it.
	if n > uint64(len(r.b))/6 {
		return fmt.Errorf("%w: %d entries declared in %d bytes", errBadAppend, n, len(r.b))
	}
	if n > 0 {
		logs := make([]raft.Log, n)
		out.Entries = make([]*raft.Log, n)
		for i := range logs {
			e := &logs[i]
			e.Index = r.uvarint("entry index")
			e.Term = r.uvarint("entry term")
			if len(r.b) == 0 {
				r.fail("entry type")
				break
			}
			e.Type = raft.LogType(r.b[0])
			r.b = r.b[1:]
			if ns := r.varint("appended-at"); ns != 0 {
				e.AppendedAt = time.Unix(0, ns)
			}
			e.Data = r.bytes("entry data")
			e.Extensions = r.bytes("entry extensions")
			out.Entries[i] = e
		}
	}
	if r.err != nil {
		return r.err
	}
	if len(r.b) != 0 {
		return fmt.Errorf("%w: %d bytes after the last entry", errBadAppend, len(r.b))
	}
	return nil
}

// Which peers read the encoding: learned from their answers.

// appendFailed forgets that peer reads binary appends when one sent as
// in was refused as undecodable (InvalidArgument: what an older build
// answers to an RPC whose msgpack is empty), so a peer address now served
// by an older build (a node rolled back) gets msgpack again until its
// answers say otherwise. Other failures (a dead peer, a pipeline closed
// because its leader stepped down) say nothing about the peer's build.
func (m *Mux) appendFailed(peer raft.ServerAddress, in *transportpb.RPC, err error) {
	if len(in.GetAppend()) > 0 && status.Code(err) == codes.InvalidArgument {
		m.forgetTakesAppend(peer)
	}
}

func (m *Mux) forgetTakesAppend(peer raft.ServerAddress) {
	if v, ok := m.heard.Load(peer); ok {
		v.(*peerHeard).takesAppend.Store(false)
	}
}

// answered notes an answer from peer: it was heard from, and whether it
// reads binary appends.
func (m *Mux) answered(peer raft.ServerAddress, out *transportpb.RPC) {
	if h := m.heardEntry(peer); h != nil && out.GetTakesAppend() && !h.takesAppend.Load() {
		h.takesAppend.Store(true)
	}
}

// appendRPC is the RPC that carries args to peer: binary if peer reads
// it, else msgpack.
func (m *Mux) appendRPC(group string, peer raft.ServerAddress, args *raft.AppendEntriesRequest) (*transportpb.RPC, error) {
	if !m.cfg.MsgpackAppends {
		if v, ok := m.heard.Load(peer); ok && v.(*peerHeard).takesAppend.Load() {
			m.stats.BinaryAppends.Add(1)
			return &transportpb.RPC{Group: group, Append: encodeAppend(nil, args)}, nil
		}
	}
	payload, err := encode(args)
	if err != nil {
		return nil, err
	}
	return &transportpb.RPC{Group: group, Msgpack: payload}, nil
}
