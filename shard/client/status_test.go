package client

import (
	"bytes"
	"encoding/json"
	"slices"
	"testing"
)

// hotAnswers are the statuses of a cluster in which n1 leads users/0 and
// ads/1, n2 leads users/1 in term 4, and n3, deposed as leader of users/1
// (term 3), still reports its old set with a higher version.
func hotAnswers() []NodeStatus {
	return []NodeStatus{
		{NodeID: "n1", Hot: []HotShard{
			{Table: "users", Shard: 0, Version: 7, Term: 2, Keys: []HotKey{{Key: 42, Rate: 1500}, {Key: 7, Rate: 3200.25}},
				ReplicaIDs: []string{"n2", "n3"}, ReplicaAddrs: []string{"a2", "a3"}},
			{Table: "ads", Shard: 1, Version: 1, Term: 1, Keys: []HotKey{{Key: 9, Rate: 1000}}},
		}},
		{NodeID: "n2", Hot: []HotShard{{Table: "users", Shard: 1, Version: 1, Term: 4, Keys: []HotKey{{Key: 11, Rate: 2000}}, ReplicaIDs: []string{"n1"}}}},
		{NodeID: "n3", Hot: []HotShard{{Table: "users", Shard: 1, Version: 9, Term: 3, Keys: []HotKey{{Key: 99, Rate: 9000}}, ReplicaIDs: []string{"n2"}}}},
	}
}

// TestHotRows: one row per hot key, by table, shard and rate; of two sets
// for one shard the later term's wins whatever its version.
func TestHotRows(t *testing.T) {
	got := hotRows(hotAnswers())
	want := []HotKeyRow{
		{Table: "ads", Shard: 1, Key: 9, Rate: 1000, ReadReplicas: []string{}},
		{Table: "users", Shard: 0, Key: 7, Rate: 3200.25, ReadReplicas: []string{"n2", "n3"}},
		{Table: "users", Shard: 0, Key: 42, Rate: 1500, ReadReplicas: []string{"n2", "n3"}},
		{Table: "users", Shard: 1, Key: 11, Rate: 2000, ReadReplicas: []string{"n1"}},
	}
	gb, _ := json.Marshal(got)
	wb, _ := json.Marshal(want)
	if string(gb) != string(wb) {
		t.Errorf("hot rows\n %s\nwant\n %s", gb, wb)
	}
	if b, _ := json.Marshal(hotRows(nil)); string(b) != "[]" {
		t.Errorf("no hot keys: JSON %s, want []", b)
	}
}

func TestServedByNode(t *testing.T) {
	st := ClusterStatus{Served: []ServedCount{
		{Node: "n1", Role: "leader", Level: "linearizable", Requests: 100, Rows: 6400},
		{Node: "n1", Role: "follower", Level: "bounded", Requests: 20, Rows: 1280, Refused: 2},
		{Node: "n2", Role: "read-replica", Level: "eventual", Requests: 30, Rows: 30},
	}}
	got := st.ServedByNode()
	want := []NodeServed{
		{Node: "n1", AsLeader: 100, AsFollower: 20, Rows: 7680, Refused: 2},
		{Node: "n2", AsReadReplica: 30, Rows: 30},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("ServedByNode: %+v, want %+v", got, want)
	}
}

// TestChains: each chain once, as the member with the newest configuration
// has it, and the JSON carries the chain fields and the checksum.
func TestChains(t *testing.T) {
	sum := uint64(7)
	st := ClusterStatus{Replicas: []ReplicaStatus{
		{Group: "c/0", Node: "n1", Replication: "chain", ChainRole: "head", ChainEpoch: 3, ChainOrder: []string{"n1", "n2"}, Checksum: &sum},
		{Group: "c/0", Node: "n2", Replication: "chain", ChainRole: "tail", ChainEpoch: 4, ChainOrder: []string{"n1", "n2", "n3"}},
		{Group: "r/0", Node: "n1", State: "leader", Replication: "raft"},
	}}
	rows := st.Chains()
	if len(rows) != 1 || rows[0].ChainEpoch != 4 || len(rows[0].ChainOrder) != 3 {
		t.Errorf("Chains = %+v, want c/0 at epoch 4 with 3 members", rows)
	}
	b, _ := json.Marshal(st.Replicas[1])
	if !bytes.Contains(b, []byte(`"chain_order":["n1","n2","n3"]`)) || !bytes.Contains(b, []byte(`"chain_epoch":4`)) {
		t.Errorf("json %s lacks the chain's order or epoch", b)
	}
	if b, _ := json.Marshal(st.Replicas[0]); !bytes.Contains(b, []byte(`"checksum":7`)) {
		t.Errorf("json %s lacks the checksum", b)
	}
}
