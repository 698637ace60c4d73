package test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/raftps/raftps/shard"
	"github.com/raftps/raftps/shard/api"
	"github.com/raftps/raftps/shard/client"
	"github.com/raftps/raftps/shard/shardpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
)

// rawConn is a gRPC connection to addr with creds that sends and receives
// messages of up to 512 MiB: an attacker's who holds credentials, bound by
// no client limit.
func rawConn(t testing.TB, addr string, creds []grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, append(creds,
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(512<<20), grpc.MaxCallRecvMsgSize(512<<20)))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// wantRefused fails the test unless err is a refusal with code and reason
// whose message says each of says.
func wantRefused(t testing.TB, what string, err error, code codes.Code, reason api.Reason, says ...string) {
	t.Helper()
	var re *api.RemoteError
	if !errors.As(api.FromStatus(err), &re) || re.Code != code || re.Reason != reason {
		t.Fatalf("%s: got %v, want %s with reason %s", what, err, code, reason)
	}
	for _, s := range says {
		if !strings.Contains(re.Msg, s) {
			t.Fatalf("%s: message %q does not say %q", what, re.Msg, s)
		}
	}
}

func keysN(base, n int) []byte {
	ks := make([]uint64, n)
	for i := range ks {
		ks[i] = uint64(base + i)
	}
	return api.KeysBytes(ks)
}

// TestLimitsAtTheBoundary: each admission limit of a node admits a request
// exactly at it and refuses one just over it, with ResourceExhausted,
// reason REQUEST_TOO_LARGE and a message naming the limit and its value;
// the refused requests change nothing (the pushes at the limit are all
// there afterwards, nothing else).
func TestLimitsAtTheBoundary(t *testing.T) {
	waitsMostly(t)
	const (
		parts      = 8
		answer     = 1 << 20
		message    = 256 << 10
		dim        = 64
		rowBytes   = 4 * dim
		answerKeys = answer / rowBytes
	)
	c := StartClusterWith(t, 1, FastRaft(), func(cfg *shard.NodeConfig) {
		cfg.MaxBatchParts, cfg.MaxAnswerBytes, cfg.MaxMessageBytes = parts, answer, message
	})
	ctx := context.Background()
	cl := c.Client()
	for _, spec := range []client.TableSpec{
		{Name: "t", Dim: dim, Shards: 1, Replicas: 1, Optimizer: "sgd:lr=1"},
		{Name: "narrow", Dim: 1, Shards: 1, Replicas: 1},
	} {
		if _, err := cl.Tables().Create(ctx, spec); err != nil {
			t.Fatal(err)
		}
	}
	ps := shardpb.NewParameterServerClient(rawConn(t, c.Addrs()[0], c.DialOptions()))

	t.Run("parts per batch", func(t *testing.T) {
		pulls := func(n int) *shardpb.PullBatchRequest {
			req := &shardpb.PullBatchRequest{}
			for i := range n {
				req.Parts = append(req.Parts, &shardpb.PullRequest{Table: "t", Keys: keysN(i, 1)})
			}
			return req
		}
		if resp, err := ps.PullBatch(ctx, pulls(parts)); err != nil || len(resp.Parts) != parts {
			t.Fatalf("pull batch of %d parts at a limit of %d: %v", parts, parts, err)
		}
		_, err := ps.PullBatch(ctx, pulls(parts+1))
		wantRefused(t, "pull batch of 9 parts", err, codes.ResourceExhausted, api.ReasonRequestTooLarge, "the limit is 8 parts per batch")
		pushes := func(n int, seq uint64) *shardpb.PushBatchRequest {
			req := &shardpb.PushBatchRequest{}
			g := make([]float32, dim)
			g[0] = 1
			for i := range n {
				req.Parts = append(req.Parts, &shardpb.PushRequest{Table: "t", ClientId: 77, Seq: seq + uint64(i), Keys: keysN(1000+i, 1), Grads: api.ValuesBytes(g)})
			}
			return req
		}
		resp, err := ps.PushBatch(ctx, pushes(parts, 1))
		if err != nil {
			t.Fatalf("push batch of %d parts at a limit of %d: %v", parts, parts, err)
		}
		for i, pe := range resp.Errors {
			if pe.Code != 0 {
				t.Fatalf("part %d of the push batch at the limit: %s", i, pe.Message)
			}
		}
		_, err = ps.PushBatch(ctx, pushes(parts+1, 100))
		wantRefused(t, "push batch of 9 parts", err, codes.ResourceExhausted, api.ReasonRequestTooLarge, "the limit is 8 parts per batch")
		// The 8 pushes at the limit are applied, the 9 refused are not.
		out := make([]float32, (parts+1)*dim)
		ks := make([]uint64, parts+1)
		for i := range ks {
			ks[i] = uint64(1000 + i)
		}
		if err := cl.Pull(ctx, "t", ks, out); err != nil {
			t.Fatal(err)
		}
		for i := range ks {
			want := float32(-1)
			if i == parts {
				want = 0
			}
			if out[i*dim] != want {
				t.Fatalf("key %d = %v after the batches, want %v", ks[i], out[i*dim], want)
			}
		}
	})

	t.Run("answer bytes of a pull", func(t *testing.T) {
		resp, err := ps.Pull(ctx, &shardpb.PullRequest{Table: "t", Keys: keysN(0, answerKeys)})
		if err != nil || len(resp.Values) != answer {
			t.Fatalf("pull of a %d-byte answer at a limit of %d: %v", answer, answer, err)
		}
		_, err = ps.Pull(ctx, &shardpb.PullRequest{Table: "t", Keys: keysN(0, answerKeys+1)})
		wantRefused(t, "pull of one row more", err, codes.ResourceExhausted, api.ReasonRequestTooLarge, "the limit is 1048576 bytes per answer")
	})

	t.Run("answer bytes of a pull batch", func(t *testing.T) {
		half := answerKeys / 2
		batch := func(extra int) *shardpb.PullBatchRequest {
			return &shardpb.PullBatchRequest{Parts: []*shardpb.PullRequest{
				{Table: "t", Keys: keysN(0, half)}, {Table: "t", Keys: keysN(half, half+extra)},
			}}
		}
		resp, err := ps.PullBatch(ctx, batch(0))
		if err != nil || len(resp.Parts[0].Values)+len(resp.Parts[1].Values) != answer {
			t.Fatalf("pull batch of a %d-byte answer at a limit of %d: %v", answer, answer, err)
		}
		_, err = ps.PullBatch(ctx, batch(1))
		wantRefused(t, "pull batch of one row more", err, codes.ResourceExhausted, api.ReasonRequestTooLarge, "the limit is 1048576 bytes per answer")
	})

	t.Run("message bytes", func(t *testing.T) {
		// The largest pull of the dim-1 table that fits, then one key more.
		n := message / 8
		for proto.Size(&shardpb.PullRequest{Table: "narrow", Keys: make([]byte, 8*n)}) > message {
			n--
		}
		if _, err := ps.Pull(ctx, &shardpb.PullRequest{Table: "narrow", Keys: keysN(0, n)}); err != nil {
			t.Fatalf("pull of %d keys, the most a %d-byte message holds: %v", n, message, err)
		}
		_, err := ps.Pull(ctx, &shardpb.PullRequest{Table: "narrow", Keys: keysN(0, n+1)})
		wantRefused(t, "pull one key over the message limit", err, codes.ResourceExhausted, api.ReasonRequestTooLarge, "larger than max message size 262144")
	})

	t.Run("checksums are rate-limited", func(t *testing.T) {
		status := func() *shardpb.ReplicaStatus {
			st, err := ps.Status(ctx, &shardpb.StatusRequest{Checksums: true})
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range st.Replicas {
				if r.Table == "t" {
					return r
				}
			}
			t.Fatal("no replica of t in status")
			return nil
		}
		// A pass now, after the interval (default 1s) since the
		// subtests' last.
		time.Sleep(shard.DefaultChecksumInterval)
		first := status()
		if !first.HasChecksum {
			t.Fatalf("first status: no checksum at applied index %d", first.AppliedIndex)
		}
		g := make([]float32, dim)
		g[1] = 1
		if err := cl.Push(ctx, "t", []uint64{5}, g); err != nil {
			t.Fatal(err)
		}
		// Within the interval: no new pass, so the replica, which has
		// moved on, reports no checksum rather than one of another index.
		if r := status(); r.AppliedIndex == first.AppliedIndex || r.HasChecksum {
			t.Fatalf("status right after a push: applied %d (was %d), has checksum %v; want a later index and none", r.AppliedIndex, first.AppliedIndex, r.HasChecksum)
		}
		time.Sleep(shard.DefaultChecksumInterval)
		if r := status(); !r.HasChecksum || r.Checksum == first.Checksum {
			t.Fatalf("status after the interval: has checksum %v (%x, was %x); want a new one", r.HasChecksum, r.Checksum, first.Checksum)
		}
	})
}
