package chain

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/raftps/raftps/replication"
	"github.com/raftps/raftps/replication/chain/chainpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// TestReadLimit: the tail answers a Read of readChunk(dim) keys and refuses
// one key more with ResourceExhausted naming the limit, before it
// allocates the answer; a member's read of more keys than one Read holds
// (tailRead) goes in several and gets every row right.
func TestReadLimit(t *testing.T) {
	const dim = 4096 // a small chunk: 63 MiB / 16 KiB = 4032 keys
	c := newCluster(t, 2, testConfig(dim))
	chunk := readChunk(dim)
	if chunk >= MaxReadKeys || chunk*4*dim > maxReadAnswerBytes || (chunk+1)*4*dim <= maxReadAnswerBytes {
		t.Fatalf("readChunk(%d) = %d does not fill %d answer bytes", dim, chunk, maxReadAnswerBytes)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Rows that differ on either side of the chunk borders.
	marked := []uint64{0, uint64(chunk - 1), uint64(chunk), uint64(2 * chunk), uint64(2*chunk + 4)}
	for i, k := range marked {
		g := make([]float32, dim)
		g[0] = -float32(k + 1)
		if _, err := c.push(ctx, &replication.Push{Client: 1, Seq: uint64(i + 1), Keys: []uint64{k}, Grads: g}); err != nil {
			t.Fatal(err)
		}
	}
	c.waitConverged(10 * time.Second)
	tail := c.chain(1)
	cc, err := grpc.NewClient(c.nodes[1].addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxMessageBytes), grpc.MaxCallSendMsgSize(MaxMessageBytes)))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	keys := func(n int) []uint64 {
		ks := make([]uint64, n)
		for i := range ks {
			ks[i] = uint64(i)
		}
		return ks
	}
	read := func(n int) (*chainpb.ReadResponse, error) {
		return chainpb.NewChainClient(cc).Read(ctx, &chainpb.ReadRequest{Group: "t/0", Epoch: tail.Epoch(), Keys: replication.KeysBytes(keys(n))})
	}
	resp, err := read(chunk)
	if err != nil || resp.Code != chainpb.Code_OK || len(resp.Rows) != chunk*dim*4 {
		t.Fatalf("a read of %d keys of dim %d, at the limit: %v %v", chunk, dim, resp.GetError(), err)
	}
	_, err = read(chunk + 1)
	if st, _ := status.FromError(err); st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), "the limit is 4032 keys per read") {
		t.Fatalf("a read of one key more: got %v, want ResourceExhausted naming the limit", err)
	}

	n := 2*chunk + 5
	out := make([]float32, n*dim)
	if _, err := c.nodes[0].mux.tailRead(ctx, 10*time.Second, c.nodes[1].addr, "t/0", tail.Epoch(), keys(n), out); err != nil {
		t.Fatalf("a member's read of %d keys, three Reads: %v", n, err)
	}
	for _, k := range keys(n) {
		want := float32(0)
		for _, m := range marked {
			if k == m {
				want = float32(k + 1)
			}
		}
		if got := out[int(k)*dim]; got != want {
			t.Fatalf("key %d read %v through the chunked read, want %v", k, got, want)
		}
	}
}
