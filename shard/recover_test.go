package shard

import (
	"bytes"
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/raftps/raftps/replication/chain/chainpb"
	"github.com/raftps/raftps/shard/shardpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// panicky panics in Status when asked for checksums, and in every chain
// Replicate stream: handlers with a bug.
type panicky struct {
	shardpb.UnimplementedParameterServerServer
	chainpb.UnimplementedChainServer
}

func (panicky) Status(_ context.Context, req *shardpb.StatusRequest) (*shardpb.StatusResponse, error) {
	if req.Checksums {
		var rows []float32
		_ = rows[len(req.String())] // out of range: a real runtime panic
	}
	return &shardpb.StatusResponse{}, nil
}

func (panicky) Replicate(grpc.BidiStreamingServer[chainpb.Forward, chainpb.Ack]) error {
	panic("stream handler bug")
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestRecoverTurnsHandlerPanicIntoInternal serves panicking handlers on
// 127.0.0.1 with a node's recoverOptions: each panic (unary and stream)
// answers codes.Internal and logs one error line with the method and the
// stack, and afterwards the server still answers calls.
func TestRecoverTurnsHandlerPanicIntoInternal(t *testing.T) {
	var logs syncBuffer
	log := hclog.New(&hclog.LoggerOptions{Output: &logs, Level: hclog.Info})
	srv := grpc.NewServer(recoverOptions(log)...)
	shardpb.RegisterParameterServerServer(srv, panicky{})
	chainpb.RegisterChainServer(srv, panicky{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(lis) //nolint:errcheck // ends with Stop
	t.Cleanup(srv.Stop)
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ps := shardpb.NewParameterServerClient(cc)

	_, err = ps.Status(ctx, &shardpb.StatusRequest{Checksums: true})
	if status.Code(err) != codes.Internal {
		t.Fatalf("unary panic answered %v, want Internal", err)
	}
	stream, err := chainpb.NewChainClient(cc).Replicate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); status.Code(err) != codes.Internal {
		t.Fatalf("stream panic answered %v, want Internal", err)
	}
	// The server is still up and serving.
	for range 3 {
		if _, err := ps.Status(ctx, &shardpb.StatusRequest{}); err != nil {
			t.Fatalf("after the panics: %v", err)
		}
	}
	out := logs.String()
	for _, want := range []string{"ParameterServer/Status", "Chain/Replicate", "index out of range", "stream handler bug", "recover_test.go"} {
		if !strings.Contains(out, want) {
			t.Fatalf("log lacks %q:\n%s", want, out)
		}
	}
	if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 2 {
		t.Fatalf("%d log lines for 2 panics, want one each:\n%s", len(lines), out)
	}
}
