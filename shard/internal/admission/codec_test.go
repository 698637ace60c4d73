package admission

import (
	"errors"
	"strings"
	"testing"

	"github.com/raftps/raftps/replication/chain/chainpb"
	"github.com/raftps/raftps/shard/shardpb"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
)

// decode runs the codec's Unmarshal on msg's wire bytes into a new message
// of into's type and returns the refusal noted for it, if any.
func decode(t *testing.T, c Codec, wire []byte, into proto.Message) error {
	t.Helper()
	if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(wire)}, into); err != nil {
		t.Fatalf("Unmarshal failed: %v", err)
	}
	return Take(into)
}

func pullBatch(parts int) []byte {
	req := &shardpb.PullBatchRequest{Parts: make([]*shardpb.PullRequest, parts)}
	for i := range req.Parts {
		req.Parts[i] = &shardpb.PullRequest{Table: "t", Keys: make([]byte, 8)}
	}
	b, err := proto.Marshal(req)
	if err != nil {
		panic(err)
	}
	return b
}

// TestCodecPartsAtTheLimit: a batch of Limit parts is decoded whole; one of
// Limit+1 is not decoded at all (the message stays empty) and its refusal
// names the limit; nothing is left noted after Take.
func TestCodecPartsAtTheLimit(t *testing.T) {
	c := Codec{Limit: 64, What: "parts per batch"}
	var ok shardpb.PullBatchRequest
	if err := decode(t, c, pullBatch(64), &ok); err != nil || len(ok.Parts) != 64 || ok.Parts[63].Table != "t" {
		t.Fatalf("64 parts at a limit of 64: refusal %v, %d parts decoded", err, len(ok.Parts))
	}
	var over shardpb.PullBatchRequest
	err := decode(t, c, pullBatch(65), &over)
	if !errors.Is(err, ErrTooManyElements) || len(over.Parts) != 0 {
		t.Fatalf("65 parts at a limit of 64: refusal %v, %d parts decoded; want ErrTooManyElements and none", err, len(over.Parts))
	}
	if want := "the limit is 64 parts per batch"; !strings.Contains(err.Error(), want) {
		t.Fatalf("refusal %q does not say %q", err, want)
	}
	if Take(&over) != nil {
		t.Fatal("the refusal is still noted after Take")
	}
}

// TestCodecCountsEveryDepth: repeated elements of nested messages count
// with their parents' (a heartbeat batch, a chain forward's entries),
// packed scalars do not, and empty elements count like full ones.
func TestCodecCountsEveryDepth(t *testing.T) {
	c := Codec{Limit: 10, What: "elements"}
	fwd, _ := proto.Marshal(&chainpb.Forward{Group: "g", Entries: make([][]byte, 11)})
	if err := decode(t, c, fwd, new(chainpb.Forward)); !errors.Is(err, ErrTooManyElements) {
		t.Fatalf("11 empty entries at a limit of 10: %v", err)
	}
	fwd, _ = proto.Marshal(&chainpb.Forward{Group: "g", Entries: make([][]byte, 10)})
	var f chainpb.Forward
	if err := decode(t, c, fwd, &f); err != nil || len(f.Entries) != 10 {
		t.Fatalf("10 entries at a limit of 10: %v, %d decoded", err, len(f.Entries))
	}
	// 5 nodes of 1 replica-list entry each, plus the 5 nodes: 10.
	st := &shardpb.StatusResponse{}
	for range 5 {
		st.Moving = append(st.Moving, &shardpb.ShardMap{Replicas: []string{"a"}})
	}
	b, _ := proto.Marshal(st)
	if err := decode(t, c, b, new(shardpb.StatusResponse)); err != nil {
		t.Fatalf("10 elements over two levels at a limit of 10: %v", err)
	}
	st.Moving[0].Replicas = append(st.Moving[0].Replicas, "b")
	b, _ = proto.Marshal(st)
	if err := decode(t, c, b, new(shardpb.StatusResponse)); !errors.Is(err, ErrTooManyElements) {
		t.Fatalf("11 elements over two levels at a limit of 10: %v", err)
	}
	// A packed list of 1000 counts is one field, not 1000 elements.
	b, _ = proto.Marshal(&shardpb.ReportHotRequest{Counts: make([]uint64, 1000)})
	var hot shardpb.ReportHotRequest
	if err := decode(t, c, b, &hot); err != nil || len(hot.Counts) != 1000 {
		t.Fatalf("1000 packed counts: %v, %d decoded", err, len(hot.Counts))
	}
}

// TestCodecMalformed: bytes that do not parse are refused as malformed,
// not decoded, and not a codec error (which gRPC would answer as Internal).
func TestCodecMalformed(t *testing.T) {
	c := Codec{Limit: 10}
	for _, wire := range [][]byte{
		{0x0a, 0x05, 0x01},       // parts: 5 bytes announced, 1 there
		{0x0a, 0x02, 0xff, 0xff}, // a part holding a truncated tag
		{0x80},                   // a truncated tag
	} {
		var m shardpb.PullBatchRequest
		if err := decode(t, c, wire, &m); !errors.Is(err, ErrMalformed) || len(m.Parts) != 0 {
			t.Errorf("wire % x: refusal %v, %d parts; want ErrMalformed and none", wire, err, len(m.Parts))
		}
	}
}

// FuzzCodec: whatever the bytes, the codec neither fails nor panics, and
// it decodes exactly what proto.Unmarshal accepts within the limit.
func FuzzCodec(f *testing.F) {
	f.Add(pullBatch(3))
	f.Add(pullBatch(9))
	f.Add([]byte{0x0a, 0x00, 0x0a, 0x00, 0x0a, 0x00})
	c := Codec{Limit: 8}
	f.Fuzz(func(t *testing.T, wire []byte) {
		var m shardpb.PullBatchRequest
		err := decode(t, c, wire, &m)
		if err == nil && proto.Unmarshal(wire, new(shardpb.PullBatchRequest)) != nil {
			t.Fatal("decoded what proto.Unmarshal refuses")
		}
		if err == nil && len(m.Parts) > 8 {
			t.Fatalf("decoded %d parts at a limit of 8", len(m.Parts))
		}
	})
}
