package client

import (
	"testing"

	"github.com/raftps/raftps/shard/shardpb"
)

// TestHotSetsKeepTheLaterLeader: of two nodes that both report a shard's
// hot set, the one with the later term (or chain epoch) wins whatever the
// versions, which restart at each leader, and whatever order they come in.
func TestHotSetsKeepTheLaterLeader(t *testing.T) {
	stale := &shardpb.HotShard{Shard: 3, Term: 4, Version: 90, Keys: []*shardpb.HotKey{{Key: 1}}, ReplicaAddrs: []string{"old"}}
	fresh := &shardpb.HotShard{Shard: 3, Term: 5, Version: 1, Keys: []*shardpb.HotKey{{Key: 2}}, ReplicaAddrs: []string{"new"}}
	newer := &shardpb.HotShard{Shard: 3, Term: 5, Version: 2, Keys: []*shardpb.HotKey{{Key: 7}}, ReplicaAddrs: []string{"newer"}}
	for _, order := range [][]*shardpb.HotShard{{stale, fresh, newer}, {newer, fresh, stale}, {fresh, newer, stale}} {
		shards := map[uint32]*hotShardView{}
		for _, hs := range order {
			addHotShard(shards, hs)
		}
		if got := shards[3]; len(got.addrs) != 1 || got.addrs[0] != "newer" || !got.keys[7] || len(got.keys) != 1 {
			t.Errorf("order term/version %v: kept %v %v, want the term-5 version-2 set", ranksOf(order), got.addrs, got.keys)
		}
	}
}

func ranksOf(hs []*shardpb.HotShard) [][2]uint64 {
	var out [][2]uint64
	for _, h := range hs {
		out = append(out, [2]uint64{h.Term, h.Version})
	}
	return out
}
