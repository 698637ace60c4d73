package main

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/raftps/raftps/shard/client"
)

func TestPrintHot(t *testing.T) {
	var out bytes.Buffer
	printHot(&out, []client.HotKeyRow{
		{Table: "ads", Shard: 1, Key: 9, Rate: 1000, ReadReplicas: []string{}},
		{Table: "users", Shard: 0, Key: 7, Rate: 3200.25, ReadReplicas: []string{"n2", "n3"}},
		{Table: "users", Shard: 1, Key: 11, Rate: 2000, ReadReplicas: []string{"n1"}},
	})
	want := `TABLE  SHARD  KEY  RATE(pulls/s)  READ-REPLICAS
ads    1      9    1000.0         (none)
users  0      7    3200.2         n2,n3
users  1      11   2000.0         n1
`
	if out.String() != want {
		t.Errorf("status --hot:\n%s\nwant:\n%s", out.String(), want)
	}
	out.Reset()
	printHot(&out, nil)
	if out.String() != "no hot keys\n" {
		t.Errorf("status --hot with none: %q", out.String())
	}
}

func TestServedByNode(t *testing.T) {
	served := []client.ServedCount{
		{Node: "n1", Role: "leader", Level: "linearizable", Requests: 100, Rows: 6400},
		{Node: "n1", Role: "follower", Level: "bounded", Requests: 20, Rows: 1280, Refused: 2},
		{Node: "n2", Role: "read-replica", Level: "eventual", Requests: 30, Rows: 30},
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
// newest configuration has it, and --json carries the chain fields and the
// checksum.
func TestChainRows(t *testing.T) {
	sum := uint64(7)
	reps := []client.ReplicaStatus{
		{Group: "c/0", Node: "n1", Replication: "chain", ChainRole: "head", ChainEpoch: 3, ChainOrder: []string{"n1", "n2"}, Checksum: &sum},
		{Group: "c/0", Node: "n2", Replication: "chain", ChainRole: "tail", ChainEpoch: 4, ChainOrder: []string{"n1", "n2", "n3"}},
		{Group: "r/0", Node: "n1", State: "leader", Replication: "raft"},
	}
	rows := chainRows(reps)
	if len(rows) != 1 || rows[0].ChainEpoch != 4 || len(rows[0].ChainOrder) != 3 {
		t.Errorf("chainRows = %+v, want c/0 at epoch 4 with 3 members", rows)
	}
	b, _ := json.Marshal(reps[1])
	if !bytes.Contains(b, []byte(`"chain_order":["n1","n2","n3"]`)) || !bytes.Contains(b, []byte(`"chain_epoch":4`)) {
		t.Errorf("json %s lacks the chain's order or epoch", b)
	}
	if b, _ := json.Marshal(reps[0]); !bytes.Contains(b, []byte(`"checksum":7`)) {
		t.Errorf("json %s lacks the checksum", b)
	}
}
