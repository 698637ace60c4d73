package client

import (
	"encoding/json"
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
