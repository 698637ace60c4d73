package meta

import (
	"bytes"
	"math"
	"testing"

	"github.com/hashicorp/raft"
	"github.com/raftps/raftps/shard/shardpb"
)

// badMetaCommands are metadata log entries no replica may take in: the
// reproductions of issue 22 for the metadata state machine (unknown and
// empty commands, truncated protos, a table of 2^32-1 shards or of no
// dimension that readers would size allocations by).
func badMetaCommands(t testing.TB) [][]byte {
	must := func(cmd byte, c cmCmd) []byte {
		b, err := Encode(cmd, c.arg)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	huge := must(CmdCreateTable, cmCmd{arg: &shardpb.TableSpec{Name: "huge", Dim: 4, Shards: math.MaxUint32}})
	noDim := must(CmdCreateTable, cmCmd{arg: &shardpb.TableSpec{Name: "nodim", Shards: 1}})
	v2 := cmCreate("v2", 1, []string{"n1"})
	v2.arg.(*shardpb.MetaCreateTable).Spec.Dim = math.MaxUint32
	v2Huge := must(CmdCreateTableV2, v2)
	noSpec := must(CmdCreateTableV2, cmCmd{arg: &shardpb.MetaCreateTable{}})
	join := must(CmdJoinJob, cmCmd{arg: &shardpb.JoinJobRequest{Job: "j", World: math.MaxUint32, Rank: -1, Addr: "a"}})
	return [][]byte{
		{}, {0x7f, 1, 2}, {CmdSetShard, 0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f},
		huge, huge[:len(huge)-2], noDim, v2Huge, noSpec, join,
	}
}

// FuzzMetaApply feeds arbitrary bytes to the metadata state machine as a
// committed entry, on two replicas holding the same state (cmState). It must
// not panic; a refused command (an error answer) must leave the state as it
// was, to the snapshot byte; both replicas must answer alike and end
// identical; and the readers the node runs on every change (ClusterMap,
// TableShards) must cope with whatever was stored.
func FuzzMetaApply(f *testing.F) {
	for _, b := range badMetaCommands(f) {
		f.Add(b)
	}
	for _, c := range append(cmBase, cmSetShard("t", 0, 1, "n4", "n1", "n2", "n3"), cmAdmin("n2", cmDraining), cmForget("n3")) {
		b, err := Encode(c.cmd, c.arg)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		a, b := newMetaLog(t), newMetaLog(t)
		cmState(t, a)
		cmState(t, b)
		before := snapshotBytes(t, a.m)
		l := &raft.Log{Index: a.index + 1, Term: 1, Type: raft.LogCommand, Data: data}
		ra, rb := a.m.Apply(l), b.m.Apply(l)
		if !cmSameOutcome(ra, rb) {
			t.Fatalf("replicas answered %v and %v", ra, rb)
		}
		after := snapshotBytes(t, a.m)
		if !bytes.Equal(after, snapshotBytes(t, b.m)) {
			t.Fatal("replicas diverged")
		}
		if _, refused := ra.(error); refused && !bytes.Equal(before, after) {
			t.Fatalf("refused command (%v) changed the state", ra)
		}
		for _, spec := range a.m.ClusterMap().Tables {
			a.m.TableShards(spec)
		}
	})
}
