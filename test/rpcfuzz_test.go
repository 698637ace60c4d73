package test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/raftps/raftps/replication/chain/chainpb"
	"github.com/raftps/raftps/replication/transportpb"
	"github.com/raftps/raftps/shard/client"
	"github.com/raftps/raftps/shard/shardpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// Fuzzing the request decoders of both listeners against a real node: a
// fuzz input is a method (a byte, modulo the listener's methods) and the
// raw bytes of its request message, sent as they are (rawCodec), so the
// node's gRPC server decodes them and its handler runs whatever checks and
// work follow. A recovered handler panic (the node's recovery interceptor
// answers Internal, "handler panicked") fails the input, and so does a node
// that stops answering afterwards. `make fuzz` runs each target for
// FUZZTIME; `go test` runs the seeds.

// clientServices and peerServices are what each listener serves.
var (
	clientServices = []protoreflect.FullName{"raftps.v1.ParameterServer"}
	peerServices   = []protoreflect.FullName{"raftps.v1.Peer", "raftps.transport.v1.RaftTransport", "raftps.chain.v1.Chain"}
)

type fuzzMethod struct {
	path   string // /service/method
	in     protoreflect.FullName
	stream bool
}

// listenerMethods lists the methods of services in descriptor order.
func listenerMethods(tb testing.TB, services []protoreflect.FullName) []fuzzMethod {
	var out []fuzzMethod
	for _, name := range services {
		d, err := protoregistry.GlobalFiles.FindDescriptorByName(name)
		if err != nil {
			tb.Fatalf("service %s: %v", name, err)
		}
		sd := d.(protoreflect.ServiceDescriptor)
		for i := range sd.Methods().Len() {
			md := sd.Methods().Get(i)
			out = append(out, fuzzMethod{
				path:   "/" + string(name) + "/" + string(md.Name()),
				in:     md.Input().FullName(),
				stream: md.IsStreamingClient() || md.IsStreamingServer(),
			})
		}
	}
	return out
}

// rawCodec sends and receives messages as the bytes they are.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return *v.(*[]byte), nil }
func (rawCodec) Unmarshal(b []byte, v any) error {
	*v.(*[]byte) = bytes.Clone(b)
	return nil
}
func (rawCodec) Name() string { return "proto" }

// fuzzNode starts a one-node cluster with a Raft table "fz" and a chain
// table "fzc" (dim 2, one shard each), so that requests naming them reach
// real groups; it returns the cluster and connections to its client and
// peer listeners.
func fuzzNode(f *testing.F) (*Cluster, *grpc.ClientConn, *grpc.ClientConn) {
	c := StartCluster(f, 1, FastRaft())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, spec := range []client.TableSpec{
		{Name: "fz", Dim: 2, Shards: 1, Replicas: 1},
		{Name: "fzc", Dim: 2, Shards: 1, Replicas: 1, Replication: client.Chain},
	} {
		if _, err := c.Client().Tables().Create(ctx, spec); err != nil {
			f.Fatal(err)
		}
	}
	dial := func(addr string, creds []grpc.DialOption) *grpc.ClientConn {
		cc, err := grpc.NewClient(addr, append(creds, grpc.WithDefaultCallOptions(grpc.ForceCodec(rawCodec{})))...)
		if err != nil {
			f.Fatal(err)
		}
		f.Cleanup(func() { cc.Close() })
		return cc
	}
	return c, dial(c.Addrs()[0], c.DialOptions()), dial(c.PeerAddr(0), c.PeerDialOptions())
}

// fuzzSeed is a seed input: a method by name and its request.
type fuzzSeed struct {
	method string
	req    proto.Message
}

// fuzzListener is the fuzz target of one listener: cc serves methods.
func fuzzListener(f *testing.F, cc, probe *grpc.ClientConn, methods []fuzzMethod, seeds []fuzzSeed) {
	for i := range methods { // every method, with an empty request
		f.Add(byte(i), []byte{})
	}
	for _, s := range seeds {
		i := slices.IndexFunc(methods, func(m fuzzMethod) bool { return strings.HasSuffix(m.path, "/"+s.method) })
		b, err := proto.Marshal(s.req)
		if i < 0 || err != nil {
			f.Fatalf("seed %s: method %d, %v", s.method, i, err)
		}
		f.Add(byte(i), b)
	}
	f.Fuzz(func(t *testing.T, which byte, req []byte) {
		m := methods[int(which)%len(methods)]
		if skipFuzzInput(m, req) {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		err := invokeRaw(ctx, cc, m, req)
		if st, _ := status.FromError(err); st.Code() == codes.Internal && strings.Contains(st.Message(), "handler panicked") {
			t.Fatalf("%s panicked on its request: %v", m.path, err)
		}
		// The node still serves, whatever the call cost.
		pctx, pcancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer pcancel()
		var out []byte
		listReq := []byte{}
		if err := probe.Invoke(pctx, "/raftps.v1.ParameterServer/ListTables", &listReq, &out); err != nil {
			t.Fatalf("after %s: the node no longer answers: %v", m.path, err)
		}
	})
}

// skipFuzzInput leaves out requests that would only make the one-node
// cluster slow for the inputs after them, not exercise a decoder: a table
// of more than 4 shards (each a Raft group to open; NormalizeSpec's range
// check is reached with fewer too).
func skipFuzzInput(m fuzzMethod, req []byte) bool {
	if m.in != "raftps.v1.CreateTableRequest" {
		return false
	}
	var r shardpb.CreateTableRequest
	return proto.Unmarshal(req, &r) == nil && r.GetSpec().GetShards() > 4
}

// invokeRaw calls m with the raw request bytes; a stream method gets them as
// its one message, then the end of the stream.
func invokeRaw(ctx context.Context, cc *grpc.ClientConn, m fuzzMethod, req []byte) error {
	var out []byte
	if !m.stream {
		return cc.Invoke(ctx, m.path, &req, &out)
	}
	s, err := cc.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, m.path)
	if err != nil {
		return err
	}
	if err := s.SendMsg(&req); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	if err := s.CloseSend(); err != nil {
		return err
	}
	for {
		if err := s.RecvMsg(&out); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
}

// FuzzClientListener fuzzes every request decoder of the client listener
// (the ParameterServer service). Seeds: a request of each data method on
// the test tables, and the large requests scaled down (a PullBatch
// of many empty parts, a push declaring more keys than values).
func FuzzClientListener(f *testing.F) {
	_, cc, _ := fuzzNode(f)
	key := binary.LittleEndian.AppendUint64(nil, 7)
	grads := binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(nil, 0x3f800000), 0x3f800000)
	many := &shardpb.PullBatchRequest{}
	for range 500 {
		many.Parts = append(many.Parts, &shardpb.PullRequest{})
	}
	fuzzListener(f, cc, cc, listenerMethods(f, clientServices), []fuzzSeed{
		{"Pull", &shardpb.PullRequest{Table: "fz", Keys: key}},
		{"Pull", &shardpb.PullRequest{Table: "fzc", Keys: key}},
		{"Push", &shardpb.PushRequest{Table: "fz", ClientId: 1, Seq: 1, Keys: key, Grads: grads}},
		{"Push", &shardpb.PushRequest{Table: "fzc", ClientId: 1, Seq: 1, Keys: key, Grads: grads}},
		{"Push", &shardpb.PushRequest{Table: "fz", ClientId: 2, Seq: 1, Keys: bytes.Repeat(key, 9), Grads: grads}},
		{"PullBatch", many},
		{"PushBatch", &shardpb.PushBatchRequest{Parts: []*shardpb.PushRequest{{Table: "fz", ClientId: 3, Seq: 1, Keys: key, Grads: grads}}}},
		{"CreateTable", &shardpb.CreateTableRequest{Spec: &shardpb.TableSpec{Name: "fz2", Dim: 2, Shards: 1, Replicas: 1}}},
		{"AlterTable", &shardpb.AlterTableRequest{Name: "fz", Consistency: shardpb.Consistency_CONSISTENCY_BOUNDED, StalenessBoundNs: 1}},
		{"Status", &shardpb.StatusRequest{Checksums: true}},
		{"JoinJob", &shardpb.JoinJobRequest{Job: "j", World: 2, Rank: -1, Addr: "127.0.0.1:1"}},
	})
}

// FuzzPeerListener fuzzes every request decoder of the peer listener: the
// Peer service, every Raft group's transport and every chain's. Seeds name
// the test tables' groups, so messages reach real replicas.
func FuzzPeerListener(f *testing.F) {
	_, cc, peer := fuzzNode(f)
	fuzzListener(f, peer, cc, listenerMethods(f, peerServices), []fuzzSeed{
		{"JoinCluster", &shardpb.JoinClusterRequest{Node: &shardpb.ClusterNode{Id: strings.Repeat("x", 1<<16), Addr: "127.0.0.1:1", PeerAddr: "127.0.0.1:2"}}},
		{"ReadIndex", &shardpb.ReadIndexRequest{Table: "fz"}},
		{"AppendEntries", &transportpb.RPC{Group: "fz/0", Msgpack: []byte{0x81, 0xa4, 'T', 'e', 'r', 'm', 0x01}}},
		{"Heartbeats", &transportpb.HeartbeatBatch{}},
		{"InstallSnapshot", &transportpb.SnapshotChunk{Group: "fz/0", Request: []byte{0xdd, 0xff, 0xff, 0xff, 0xff}}},
		{"Read", &chainpb.ReadRequest{Group: "fzc/0", Epoch: 1, Keys: binary.LittleEndian.AppendUint64(nil, 7)}},
		{"Replicate", &chainpb.Forward{Group: "fzc/0", Epoch: 1, From: "127.0.0.1:1", FirstIndex: 1, Entries: [][]byte{{1, 0, 0, 0, 0, 0, 0, 0, 0x7f}}}},
	})
}
