package main

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/raftps/raftps/shard/shardpb"
)

// hotAnswers are the Status answers of a cluster in which n1 leads
// users/0 and ads/1, n2 leads users/1, and n3 was deposed as leader of
// users/1 (term 3; n2 leads it in term 4) and still reports its old set.
func hotAnswers() []*shardpb.StatusResponse {
	return []*shardpb.StatusResponse{
		{NodeId: "n1",
			Replicas: []*shardpb.ReplicaStatus{{Group: "users/0", State: "leader", Term: 2}, {Group: "ads/1", State: "leader", Term: 1}},
			Hot: []*shardpb.HotShard{
				{Table: "users", Shard: 0, Version: 7, Keys: []*shardpb.HotKey{{Key: 42, Rate: 1500}, {Key: 7, Rate: 3200.25}},
					ReplicaIds: []string{"n2", "n3"}, ReplicaAddrs: []string{"a2", "a3"}},
				{Table: "ads", Shard: 1, Version: 1, Keys: []*shardpb.HotKey{{Key: 9, Rate: 1000}}},
			},
			Served: []*shardpb.ServedCount{
				{Role: "leader", Level: "linearizable", Requests: 100, Rows: 6400},
				{Role: "follower", Level: "bounded", Requests: 20, Rows: 1280, Refused: 2},
			}},
		{NodeId: "n2",
			Replicas: []*shardpb.ReplicaStatus{{Group: "users/1", State: "leader", Term: 4}},
			Hot:      []*shardpb.HotShard{{Table: "users", Shard: 1, Version: 1, Keys: []*shardpb.HotKey{{Key: 11, Rate: 2000}}, ReplicaIds: []string{"n1"}}},
			Served: []*shardpb.ServedCount{
				{Role: "read-replica", Level: "eventual", Requests: 30, Rows: 30},
			}},
		{NodeId: "n3",
			Replicas: []*shardpb.ReplicaStatus{{Group: "users/1", State: "leader", Term: 3}},
			Hot:      []*shardpb.HotShard{{Table: "users", Shard: 1, Version: 9, Keys: []*shardpb.HotKey{{Key: 99, Rate: 9000}}, ReplicaIds: []string{"n2"}}}},
	}
}

func TestHotRows(t *testing.T) {
	var out bytes.Buffer
	printHot(&out, hotRows(hotAnswers()))
	want := `TABLE  SHARD  KEY  RATE(pulls/s)  READ-REPLICAS
ads    1      9    1000.0         (none)
users  0      7    3200.2         n2,n3
users  0      42   1500.0         n2,n3
users  1      11   2000.0         n1
`
	if out.String() != want {
		t.Errorf("status --hot:\n%s\nwant:\n%s", out.String(), want)
	}
	out.Reset()
	printHot(&out, hotRows(nil))
	if out.String() != "no hot keys\n" {
		t.Errorf("status --hot with none: %q", out.String())
	}
}

func TestHotRowsJSON(t *testing.T) {
	b, err := json.Marshal(hotRows(hotAnswers())[:1])
	if err != nil {
		t.Fatal(err)
	}
	want := `[{"table":"ads","shard":1,"key":9,"rate":1000,"read_replicas":[]}]`
	if string(b) != want {
		t.Errorf("hot JSON %s, want %s", b, want)
	}
	if b, _ := json.Marshal(hotRows(nil)); string(b) != "[]" {
		t.Errorf("no hot keys: JSON %s, want []", b)
	}
}

func TestServedByNode(t *testing.T) {
	var served []servedJSON
	for _, st := range hotAnswers() {
		for _, c := range st.Served {
			served = append(served, servedJSON{Node: st.NodeId, Role: c.Role, Level: c.Level, Requests: c.Requests, Rows: c.Rows, Refused: c.Refused})
		}
	}
	got := servedByNode(served)
	want := []nodeServed{
		{node: "n1", requests: [3]uint64{100, 20, 0}, rows: 7680, refused: 2},
		{node: "n2", requests: [3]uint64{0, 0, 30}, rows: 30},
	}
	if len(got) != len(want) {
		t.Fatalf("servedByNode: %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("servedByNode[%d] = %+v, want %+v", i, got[i], want[i])
		}
	}
}

// TestChainRows: status shows each chain once, as the member with the
// newest configuration has it, and replicaOf carries the chain fields and
// the checksum into --json.
func TestChainRows(t *testing.T) {
	var reps []replicaJSON
	for _, r := range []struct {
		node string
		rs   *shardpb.ReplicaStatus
	}{
		{"n1", &shardpb.ReplicaStatus{Group: "c/0", Replication: "chain", ChainRole: "head", ChainEpoch: 3, ChainOrder: []string{"n1", "n2"}, HasChecksum: true, Checksum: 7}},
		{"n2", &shardpb.ReplicaStatus{Group: "c/0", Replication: "chain", ChainRole: "tail", ChainEpoch: 4, ChainOrder: []string{"n1", "n2", "n3"}}},
		{"n1", &shardpb.ReplicaStatus{Group: "r/0", State: "leader"}},
	} {
		reps = append(reps, replicaOf(r.node, r.rs))
	}
	if reps[0].Checksum == nil || *reps[0].Checksum != 7 || reps[1].Checksum != nil || reps[2].Replication != "raft" {
		t.Errorf("replicaOf: %+v", reps)
	}
	rows := chainRows(reps)
	if len(rows) != 1 || rows[0].ChainEpoch != 4 || len(rows[0].ChainOrder) != 3 {
		t.Errorf("chainRows = %+v, want c/0 at epoch 4 with 3 members", rows)
	}
	b, _ := json.Marshal(reps[1])
	if !bytes.Contains(b, []byte(`"chain_order":["n1","n2","n3"]`)) || !bytes.Contains(b, []byte(`"chain_epoch":4`)) {
		t.Errorf("json %s lacks the chain's order or epoch", b)
	}
}
