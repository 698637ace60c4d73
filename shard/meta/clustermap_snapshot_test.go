package meta

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/raftps/raftps/shard/api"
	"github.com/raftps/raftps/shard/shardpb"
	"github.com/raftps/raftps/store"
	"google.golang.org/protobuf/proto"
)

// Tests of the cluster map in snapshots (formats 2 and 3) and of the
// determinism of its commands: replicas fed the same log agree to the byte.

// cmState builds a state with every kind of content: tables with and without
// map entries, jobs, nodes in every admin state, entries at several epochs
// with a node being added, a forgotten node.
func cmState(t *testing.T, l *metaLog) {
	t.Helper()
	cmMustApply(t, l, cmBase...)
	cmMustApply(t, l,
		cmCmd{CmdCreateTable, &shardpb.TableSpec{Name: "legacy", Dim: 2, Shards: 1, Replicas: 1}},
		cmRegister("n5", "a5", ""),
		cmRegister("n6", "a6", "g6"),
		cmCreate("u", 2, []string{"n1", "n5"}, []string{"n5", "n6"}, []string{"n6", "n1"}),
		cmAdmin("n2", cmDraining),
		cmSetShard("t", 0, 1, "n4", "n1", "n2", "n3"),
		cmSetShard("t", 0, 2, "", "n1", "n3", "n4"),
		cmSetShard("t", 1, 1, "n5", "n3", "n4"),
		cmAdmin("n6", cmRemoved),
		cmRegister("n7", "a7", "g7"),
		cmAdmin("n7", cmRemoved),
		cmForget("n7"),
		cmRegister("n1", "a1", "g1b"),
	)
	l.mustJoin("train", 2, -1, "h0:1", 0, 1)
	l.mustJoin("train", 2, -1, "h1:1", 1, 1)
	l.mustJoin("eval", 3, 1, "h9:1", 1, 1)
	// A few refusals, which must not show.
	for _, c := range []cmCmd{cmForget("n6"), cmAdmin("n6", cmActive), cmSetShard("u", 0, 7, "", "n1")} {
		if _, ok := l.apply(c.cmd, c.arg).(error); !ok {
			t.Fatalf("%v accepted", c.arg)
		}
	}
}

// TestClusterMapSnapshotRoundTrip: a format 3 snapshot restores tables, jobs,
// nodes, shard entries and the map version exactly, replacing what the
// restoring FSM held; the restored FSM snapshots to the same bytes and goes
// on applying commands exactly like the original.
func TestClusterMapSnapshotRoundTrip(t *testing.T) {
	l := newMetaLog(t)
	cmState(t, l)
	want := l.m.ClusterMap()
	if want.Version != cmBaseVersion+13 || len(want.Nodes) != 6 || len(want.Shards) != 5 || len(want.Tables) != 3 {
		t.Fatalf("unexpected state to snapshot: %v", want)
	}
	b := snapshotBytes(t, l.m)
	if binary.LittleEndian.Uint32(b) != snapshotMarker || binary.LittleEndian.Uint32(b[4:]) != 3 {
		t.Fatalf("snapshot header % x, want the marker and format 3", b[:8])
	}

	changes := 0
	r := cmLog(t, &changes)
	// Whatever the restoring FSM held is replaced, not merged.
	cmMustApply(t, r, cmRegister("stale", "as", "gs"), cmCreate("stale", 1, []string{"stale"}))
	r.mustJoin("stalejob", 1, -1, "x", 0, 1)
	if err := restore(r.m, b); err != nil {
		t.Fatal(err)
	}
	if changes != 3 { // two applied commands, the restore
		t.Errorf("onChange called %d times, want 3", changes)
	}
	if got := r.m.ClusterMap(); !proto.Equal(got, want) {
		t.Fatalf("restored map\n got %v\nwant %v", got, want)
	}
	if r.m.Version() != want.Version {
		t.Fatalf("restored version %d, want %d", r.m.Version(), want.Version)
	}
	for _, pair := range []struct{ got, want []proto.Message }{
		{msgs(r.m.List()), msgs(l.m.List())},
		{msgs(r.m.JobList()), msgs(l.m.JobList())},
	} {
		if len(pair.got) != len(pair.want) {
			t.Fatalf("restored %v, want %v", pair.got, pair.want)
		}
		for i := range pair.got {
			if !proto.Equal(pair.got[i], pair.want[i]) {
				t.Fatalf("restored %v, want %v", pair.got[i], pair.want[i])
			}
		}
	}
	if !bytes.Equal(snapshotBytes(t, r.m), b) {
		t.Fatal("the restored FSM snapshots to other bytes")
	}

	// Both go on identically: accepted and refused commands alike.
	r.index = l.index
	for _, c := range []cmCmd{
		cmSetShard("t", 0, 3, "", "n1", "n3", "n4", "n2"), // t/0 is at epoch 3
		cmSetShard("t", 0, 3, "", "n1"),                   // now stale
		cmRegister("n1", "a1", "g1b"),                     // unchanged
		cmRegister("n6", "a6", "g6"),                      // removed
		cmRegister("n7", "a7", "g7"),                      // forgotten: new again
		cmAdmin("n2", cmActive),
		cmForget("n6"), // still holds u/1 and u/2
		cmSetShard("u", 1, 1, "", "n5"),
		cmSetShard("u", 2, 1, "", "n1"),
		cmForget("n6"),
		cmCreate("u", 1, []string{"n1"}),
	} {
		ol, or := l.apply(c.cmd, c.arg), r.apply(c.cmd, c.arg)
		if !cmSameOutcome(ol, or) {
			t.Fatalf("%v: %v on the original, %v on the restored", c.arg, ol, or)
		}
	}
	if cm := l.m.ClusterMap(); !proto.Equal(cm, r.m.ClusterMap()) || cmNode(cm, "n6") != nil || cmNode(cm, "n7") == nil {
		t.Fatalf("after more commands: original %v, restored %v", cm, r.m.ClusterMap())
	}
	if !bytes.Equal(snapshotBytes(t, l.m), snapshotBytes(t, r.m)) {
		t.Fatal("after more commands, the snapshots differ")
	}
}

// TestClusterMapRestoreFormat2: a snapshot from before the cluster map
// (marker, format 2, a MetaSnapshot with tables and jobs only) restores the
// tables and jobs and an empty map at version 0; map commands then work from
// there.
func TestClusterMapRestoreFormat2(t *testing.T) {
	old := &shardpb.MetaSnapshot{
		Tables: []*shardpb.TableSpec{{Name: "a", Dim: 4, Shards: 2, Replicas: 3}, {Name: "b", Dim: 8, Shards: 1, Replicas: 1}},
		Jobs:   []*shardpb.Job{{Name: "j", World: 2, Round: 3, Members: []*shardpb.JobMember{{Rank: 1, Addr: "h1"}}}},
	}
	b := binary.LittleEndian.AppendUint32(nil, snapshotMarker)
	b = binary.LittleEndian.AppendUint32(b, 2)
	b, err := deterministic.MarshalAppend(b, old)
	if err != nil {
		t.Fatal(err)
	}
	l := newMetaLog(t)
	cmState(t, l) // a full map, which the restore must clear
	if err := restore(l.m, b); err != nil {
		t.Fatal(err)
	}
	want := &shardpb.ClusterMap{Tables: old.Tables}
	if got := l.m.ClusterMap(); !proto.Equal(got, want) {
		t.Fatalf("restored map\n got %v\nwant %v", got, want)
	}
	if jobs := l.m.JobList(); len(jobs) != 1 || !proto.Equal(jobs[0], old.Jobs[0]) {
		t.Fatalf("restored jobs %v, want %v", jobs, old.Jobs)
	}
	// The tables have no entries; nodes can register from version 0.
	if err, _ := l.apply(CmdSetShard, &shardpb.MetaSetShard{Table: "a", Shard: 0, ExpectEpoch: 1, Replicas: []string{"n1"}}).(error); !errors.Is(err, api.ErrUnknownShard) {
		t.Fatalf("changing a table without entries: %v, want api.ErrUnknownShard", err)
	}
	cmMustApply(t, l, cmRegister("n1", "a1", "g1"))
	if v := l.m.Version(); v != 1 {
		t.Fatalf("version %d after one registration, want 1", v)
	}
	// Snapshotting again writes format 3, which restores the same.
	b3 := snapshotBytes(t, l.m)
	if binary.LittleEndian.Uint32(b3[4:]) != 3 {
		t.Fatal("not format 3")
	}
	m := New(func() {})
	if err := restore(m, b3); err != nil || !proto.Equal(m.ClusterMap(), l.m.ClusterMap()) {
		t.Fatalf("format 3 after format 2: %v, %v", err, m.ClusterMap())
	}
}

// TestClusterMapSnapshotDeterministic: two FSMs that applied the same
// commands in the same order write identical snapshot bytes, whatever order
// their maps iterate in.
func TestClusterMapSnapshotDeterministic(t *testing.T) {
	var snaps [][]byte
	for range 5 {
		l := newMetaLog(t)
		cmState(t, l)
		snaps = append(snaps, snapshotBytes(t, l.m))
	}
	for i := 1; i < len(snaps); i++ {
		if !bytes.Equal(snaps[0], snaps[i]) {
			t.Fatalf("snapshot %d differs from snapshot 0", i)
		}
	}
}

// cmSameOutcome reports whether two Apply results agree on what must be the same on every
// replica: the sentinel a refusal wraps, or the answer.
func cmSameOutcome(a, b any) bool {
	ea, aerr := a.(error)
	eb, berr := b.(error)
	if aerr || berr {
		return aerr && berr && cmSentinel(ea) == cmSentinel(eb)
	}
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return proto.Equal(a.(proto.Message), b.(proto.Message))
}

func cmSentinel(err error) string {
	for _, s := range []error{api.ErrBadRequest, api.ErrNodeConflict, api.ErrUnknownNode, api.ErrUnknownShard, api.ErrEpochChanged, store.ErrTableExists} {
		if errors.Is(err, s) {
			return s.Error()
		}
	}
	return "other: " + err.Error()
}

// TestClusterMapApplyDeterministic: replicas fed the same random sequence of
// map commands, many of them refused, answer the same to each and end with
// identical maps and snapshot bytes; so does a replica that joins halfway by
// restoring a snapshot.
func TestClusterMapApplyDeterministic(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	a, b := newMetaLog(t), newMetaLog(t)
	var c *metaLog
	ids := []string{"n0", "n1", "n2", "n3", "n4", "n5", "n6", "nx"}
	pick := func() string { return ids[rng.IntN(len(ids))] }
	refused, accepted := 0, 0
	for i := range 3000 {
		var cmd cmCmd
		switch k := rng.IntN(20); {
		case k < 5:
			cmd = cmRegister(pick(), fmt.Sprintf("a%d", rng.IntN(7)), fmt.Sprintf("g%d", rng.IntN(2)))
		case k < 8:
			cmd = cmAdmin(pick(), shardpb.NodeAdmin(rng.IntN(3)))
		case k < 10:
			cmd = cmForget(pick())
		case k < 11:
			var placement [][]string
			for range 1 + rng.IntN(3) {
				placement = append(placement, []string{pick(), pick()})
			}
			cc := cmCreate(fmt.Sprintf("t%d", rng.IntN(6)), 2, placement...)
			if rng.IntN(10) == 0 { // a malformed one now and then
				cc.arg.(*shardpb.MetaCreateTable).Spec.Shards++
			}
			cmd = cc
		default:
			table, shard := fmt.Sprintf("t%d", rng.IntN(6)), uint32(rng.IntN(3))
			// Mostly the current epoch, as a scheduler would, sometimes a stale one.
			epoch := a.m.ShardMap(table, shard).GetEpoch()
			if rng.IntN(4) == 0 {
				epoch = uint64(rng.IntN(4))
			}
			var replicas []string
			for range rng.IntN(4) {
				replicas = append(replicas, pick())
			}
			adding := ""
			if rng.IntN(3) == 0 {
				adding = pick()
			}
			cmd = cmSetShard(table, shard, epoch, adding, replicas...)
		}
		outs := []any{a.apply(cmd.cmd, cmd.arg), b.apply(cmd.cmd, cmd.arg)}
		if c != nil {
			outs = append(outs, c.apply(cmd.cmd, cmd.arg))
		}
		for _, o := range outs[1:] {
			if !cmSameOutcome(outs[0], o) {
				t.Fatalf("command %d %v: %v on one replica, %v on another", i, cmd.arg, outs[0], o)
			}
		}
		if _, ok := outs[0].(error); ok {
			refused++
		} else {
			accepted++
		}
		if i == 1500 {
			c = newMetaLog(t)
			if err := restore(c.m, snapshotBytes(t, a.m)); err != nil {
				t.Fatal(err)
			}
			c.index = a.index
		}
	}
	t.Logf("%d commands accepted, %d refused; map version %d", accepted, refused, a.m.Version())
	if refused < 300 || accepted < 300 {
		t.Fatalf("%d accepted, %d refused: the sequence does not exercise both", accepted, refused)
	}
	want := a.m.ClusterMap()
	for _, r := range []*metaLog{b, c} {
		if got := r.m.ClusterMap(); !proto.Equal(got, want) {
			t.Fatalf("maps differ:\n%v\n%v", got, want)
		}
	}
	sa := snapshotBytes(t, a.m)
	if !bytes.Equal(sa, snapshotBytes(t, b.m)) || !bytes.Equal(sa, snapshotBytes(t, c.m)) {
		t.Fatal("replicas that applied the same log have different snapshots")
	}
	// Invariants of the map itself.
	for _, sm := range want.Shards {
		if sm.Epoch < 1 || len(sm.Replicas) == 0 {
			t.Fatalf("entry %v", sm)
		}
		if spec := cmTable(want, sm.Table); spec == nil || sm.Shard >= spec.Shards {
			t.Fatalf("entry %v of no table shard", sm)
		}
	}
	addrs := map[string]string{}
	for _, nd := range want.Nodes {
		if o, ok := addrs[nd.Addr]; ok {
			t.Fatalf("nodes %s and %s both at %s", o, nd.Id, nd.Addr)
		}
		addrs[nd.Addr] = nd.Id
	}
}
