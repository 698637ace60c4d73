package shard

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

// Tests of the cluster map part of the metadata FSM (clustermap.go): node
// registration and admin states, forgetting nodes, table creation with
// placement, the compare-and-set on shard epochs, snapshots and determinism.
// Commands go through metaLog (meta_test.go), i.e. through Apply with the
// encoding the leader uses.

// cmCmd is one metadata command.
type cmCmd struct {
	cmd byte
	arg proto.Message
}

// cmRegister registers node id at client address addr ("aK"), with the
// peer address "pK" that goes with it.
func cmRegister(id, addr, gossip string) cmCmd {
	return cmRegisterPeer(id, addr, cmPeer(addr), gossip)
}

func cmRegisterPeer(id, addr, peer, gossip string) cmCmd {
	return cmCmd{metaRegisterNode, &shardpb.ClusterNode{Id: id, Addr: addr, PeerAddr: peer, GossipAddr: gossip}}
}

// cmPeer is the peer address the tests give client address addr.
func cmPeer(addr string) string {
	if addr == "" {
		return ""
	}
	return "p" + addr[1:]
}

func cmAdmin(id string, a shardpb.NodeAdmin) cmCmd {
	return cmCmd{metaSetNodeAdmin, &shardpb.SetNodeAdminRequest{Id: id, Admin: a}}
}

func cmForget(id string) cmCmd {
	return cmCmd{metaForgetNode, &shardpb.SetNodeAdminRequest{Id: id}}
}

func cmSetShard(table string, shard uint32, expect uint64, adding string, replicas ...string) cmCmd {
	return cmCmd{metaSetShard, &shardpb.MetaSetShard{Table: table, Shard: shard, ExpectEpoch: expect, Replicas: replicas, Adding: adding}}
}

// cmCreate creates table name with one shard entry per element of
// placement (each a replica list).
func cmCreate(name string, replicas uint32, placement ...[]string) cmCmd {
	c := &shardpb.MetaCreateTable{Spec: &shardpb.TableSpec{Name: name, Dim: 4, Shards: uint32(len(placement)), Replicas: replicas}}
	for s, r := range placement {
		c.Shards = append(c.Shards, &shardpb.ShardMap{Table: name, Shard: uint32(s), Replicas: r})
	}
	return cmCmd{metaCreateTableV2, c}
}

const (
	cmActive   = shardpb.NodeAdmin_NODE_ACTIVE
	cmDraining = shardpb.NodeAdmin_NODE_DRAINING
	cmRemoved  = shardpb.NodeAdmin_NODE_REMOVED
)

// cmBase is the state every table-driven case starts from: nodes n1..n4 at
// a1..a4 (gossip g1..g4), and table t with t/0 on n1 n2 n3 and t/1 on n2
// n3 n4, both at epoch 1. Five map changes: map version 5.
var cmBase = []cmCmd{
	cmRegister("n1", "a1", "g1"),
	cmRegister("n2", "a2", "g2"),
	cmRegister("n3", "a3", "g3"),
	cmRegister("n4", "a4", "g4"),
	cmCreate("t", 3, []string{"n1", "n2", "n3"}, []string{"n2", "n3", "n4"}),
}

const cmBaseVersion = 5

// cmLog is a metaLog whose FSM counts its onChange calls.
func cmLog(t *testing.T, changes *int) *metaLog {
	return &metaLog{t: t, m: newMetaFSM(func() { *changes++ })}
}

// cmMustApply applies cmds, failing the test on any refusal.
func cmMustApply(t *testing.T, l *metaLog, cmds ...cmCmd) {
	t.Helper()
	for _, c := range cmds {
		if err, ok := l.apply(c.cmd, c.arg).(error); ok {
			t.Fatalf("command %d %v: %v", c.cmd, c.arg, err)
		}
	}
}

func cmNode(cm *shardpb.ClusterMap, id string) *shardpb.ClusterNode {
	for _, nd := range cm.Nodes {
		if nd.Id == id {
			return nd
		}
	}
	return nil
}

func cmShard(cm *shardpb.ClusterMap, table string, shard uint32) *shardpb.ShardMap {
	for _, sm := range cm.Shards {
		if sm.Table == table && sm.Shard == shard {
			return sm
		}
	}
	return nil
}

func cmTable(cm *shardpb.ClusterMap, name string) *shardpb.TableSpec {
	for _, s := range cm.Tables {
		if s.Name == name {
			return s
		}
	}
	return nil
}

// cmOthers returns cm's shards except table/shard, and its nodes except
// ids, for "nothing else changed" comparisons.
func cmOthers(cm *shardpb.ClusterMap, table string, shard uint32, ids ...string) *shardpb.ClusterMap {
	out := &shardpb.ClusterMap{Tables: cm.Tables}
	for _, sm := range cm.Shards {
		if sm.Table != table || sm.Shard != shard {
			out.Shards = append(out.Shards, sm)
		}
	}
next:
	for _, nd := range cm.Nodes {
		for _, id := range ids {
			if nd.Id == id {
				continue next
			}
		}
		out.Nodes = append(out.Nodes, nd)
	}
	return out
}

// cmCase is one command applied after cmBase and setup. If want is set, the
// command must be refused with it and change nothing at all: the map
// (version included), the snapshot bytes, no onChange call. Otherwise it must
// succeed, move the map version by delta, and check must hold.
type cmCase struct {
	name  string
	setup []cmCmd
	cmd   cmCmd
	want  error
	delta uint64
	check func(t *testing.T, before, after *shardpb.ClusterMap, out any)
}

func runCMCases(t *testing.T, cases []cmCase) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			changes := 0
			l := cmLog(t, &changes)
			cmMustApply(t, l, cmBase...)
			cmMustApply(t, l, c.setup...)
			before, snapBefore, changesBefore := l.m.clusterMap(), snapshotBytes(t, l.m), changes
			out := l.apply(c.cmd.cmd, c.cmd.arg)
			after := l.m.clusterMap()
			err, _ := out.(error)
			if c.want != nil {
				if !errors.Is(err, c.want) {
					t.Fatalf("got %v, want an error wrapping %v", out, c.want)
				}
				if !proto.Equal(before, after) {
					t.Fatalf("a refused command changed the map:\nbefore %v\nafter  %v", before, after)
				}
				if !bytes.Equal(snapBefore, snapshotBytes(t, l.m)) {
					t.Fatal("a refused command changed the snapshot")
				}
				if changes != changesBefore {
					t.Fatal("a refused command called onChange")
				}
				return
			}
			if err != nil {
				t.Fatalf("refused: %v", err)
			}
			if got := after.Version - before.Version; got != c.delta {
				t.Fatalf("map version %d -> %d, want +%d", before.Version, after.Version, c.delta)
			}
			if c.delta == 0 && !proto.Equal(before, after) {
				t.Fatalf("an unchanging command changed the map:\nbefore %v\nafter  %v", before, after)
			}
			if c.check != nil {
				c.check(t, before, after, out)
			}
		})
	}
}

func TestClusterMapBase(t *testing.T) {
	// The base state itself: four active nodes, two epoch-1 entries, version 5.
	l := newMetaLog(t)
	cmMustApply(t, l, cmBase...)
	cm := l.m.clusterMap()
	want := &shardpb.ClusterMap{
		Version: cmBaseVersion,
		Nodes: []*shardpb.ClusterNode{
			{Id: "n1", Addr: "a1", PeerAddr: "p1", GossipAddr: "g1"}, {Id: "n2", Addr: "a2", PeerAddr: "p2", GossipAddr: "g2"},
			{Id: "n3", Addr: "a3", PeerAddr: "p3", GossipAddr: "g3"}, {Id: "n4", Addr: "a4", PeerAddr: "p4", GossipAddr: "g4"},
		},
		Shards: []*shardpb.ShardMap{
			{Table: "t", Shard: 0, Replicas: []string{"n1", "n2", "n3"}, Epoch: 1},
			{Table: "t", Shard: 1, Replicas: []string{"n2", "n3", "n4"}, Epoch: 1},
		},
		Tables: []*shardpb.TableSpec{{Name: "t", Dim: 4, Shards: 2, Replicas: 3}},
	}
	if !proto.Equal(cm, want) {
		t.Fatalf("base map\n got %v\nwant %v", cm, want)
	}
	if l.m.version() != cmBaseVersion {
		t.Fatalf("version() %d, clusterMap().Version %d", l.m.version(), cm.Version)
	}
}

func TestClusterMapRegisterNode(t *testing.T) {
	runCMCases(t, []cmCase{
		{
			// A new node is in the map, active, with its addresses; version +1.
			name: "new node", cmd: cmRegister("n5", "a5", "g5"), delta: 1,
			check: func(t *testing.T, before, after *shardpb.ClusterMap, out any) {
				want := &shardpb.ClusterNode{Id: "n5", Addr: "a5", PeerAddr: "p5", GossipAddr: "g5", Admin: cmActive}
				if !proto.Equal(cmNode(after, "n5"), want) || !proto.Equal(out.(proto.Message), want) {
					t.Fatalf("n5 in map %v, returned %v; want %v", cmNode(after, "n5"), out, want)
				}
				if !proto.Equal(cmOthers(after, "", 0, "n5"), cmOthers(before, "", 0)) {
					t.Fatal("registering n5 changed other entries")
				}
			},
		},
		{
			// Registering again unchanged (a restarted node) changes nothing,
			// not even the version, and answers the existing entry.
			name: "same again", cmd: cmRegister("n1", "a1", "g1"), delta: 0,
			check: func(t *testing.T, before, after *shardpb.ClusterMap, out any) {
				if !proto.Equal(out.(proto.Message), cmNode(before, "n1")) {
					t.Fatalf("returned %v, want the existing %v", out, cmNode(before, "n1"))
				}
			},
		},
		{
			// Unchanged re-registration of a draining node: still no change,
			// and it stays draining.
			name: "same again while draining", setup: []cmCmd{cmAdmin("n1", cmDraining)},
			cmd: cmRegister("n1", "a1", "g1"), delta: 0,
		},
		{
			// Another ID at an address already in the map is refused.
			name: "address taken", cmd: cmRegister("n5", "a1", "g5"), want: api.ErrNodeConflict,
		},
		{
			// A known node moving to another node's address is refused too.
			name: "move to taken address", cmd: cmRegister("n1", "a2", "g1"), want: api.ErrNodeConflict,
		},
		{
			// A removed node's address stays reserved until it is forgotten.
			name: "address of removed node", setup: []cmCmd{cmAdmin("n1", cmRemoved)},
			cmd: cmRegister("n5", "a1", "g5"), want: api.ErrNodeConflict,
		},
		{
			// A removed node cannot come back under its ID, unchanged...
			name: "removed, same address", setup: []cmCmd{cmAdmin("n1", cmRemoved)},
			cmd: cmRegister("n1", "a1", "g1"), want: api.ErrNodeConflict,
		},
		{
			// ...nor at a new address.
			name: "removed, new address", setup: []cmCmd{cmAdmin("n1", cmRemoved)},
			cmd: cmRegister("n1", "a9", "g9"), want: api.ErrNodeConflict,
		},
		{
			// A draining node restarted at a new address: the addresses are
			// replaced, it stays draining, version +1, nothing else changes.
			name: "new address keeps draining", setup: []cmCmd{cmRegister("n5", "a5", "g5"), cmAdmin("n5", cmDraining)},
			cmd: cmRegister("n5", "a9", "g9"), delta: 1,
			check: func(t *testing.T, before, after *shardpb.ClusterMap, out any) {
				want := &shardpb.ClusterNode{Id: "n5", Addr: "a9", PeerAddr: "p9", GossipAddr: "g9", Admin: cmDraining}
				if got := cmNode(after, "n5"); !proto.Equal(got, want) {
					t.Fatalf("n5 %v, want %v", got, want)
				}
				if !proto.Equal(cmOthers(after, "", 0, "n5"), cmOthers(before, "", 0, "n5")) {
					t.Fatal("re-registering n5 changed other entries")
				}
			},
		},
		{
			// A node holding replicas cannot move to a new peer address: its
			// groups know it at the old one and would never reach it.
			name: "new address while holding replicas", cmd: cmRegister("n1", "a9", "g1"), want: api.ErrNodeConflict,
		},
		{
			// A new client address alone is harmless: clients learn it
			// from the map.
			name: "new client address while holding replicas", cmd: cmRegisterPeer("n1", "a9", "p1", "g1"), delta: 1,
			check: func(t *testing.T, before, after *shardpb.ClusterMap, out any) {
				want := &shardpb.ClusterNode{Id: "n1", Addr: "a9", PeerAddr: "p1", GossipAddr: "g1", Admin: cmActive}
				if got := cmNode(after, "n1"); !proto.Equal(got, want) {
					t.Fatalf("n1 %v, want %v", got, want)
				}
			},
		},
		{
			// Another ID at a peer address already in the map is refused.
			name: "peer address taken", cmd: cmRegisterPeer("n5", "a5", "p1", "g5"), want: api.ErrNodeConflict,
		},
		{
			// No peer address: refused.
			name: "no peer address", cmd: cmRegisterPeer("n5", "a5", "", "g5"), want: api.ErrBadRequest,
		},
		{
			// An active node at a new address stays active; its old address
			// is free for others afterwards (checked in
			// TestClusterMapRegisterSequence).
			name: "new address keeps active", setup: []cmCmd{cmRegister("n5", "a5", "g5")}, cmd: cmRegister("n5", "a9", "g5"), delta: 1,
			check: func(t *testing.T, before, after *shardpb.ClusterMap, out any) {
				want := &shardpb.ClusterNode{Id: "n5", Addr: "a9", PeerAddr: "p9", GossipAddr: "g5", Admin: cmActive}
				if got := cmNode(after, "n5"); !proto.Equal(got, want) {
					t.Fatalf("n5 %v, want %v", got, want)
				}
			},
		},
		{
			// A new gossip address alone is a change too.
			name: "new gossip address", cmd: cmRegister("n1", "a1", "g9"), delta: 1,
			check: func(t *testing.T, before, after *shardpb.ClusterMap, out any) {
				if got := cmNode(after, "n1").GossipAddr; got != "g9" {
					t.Fatalf("gossip address %q, want g9", got)
				}
			},
		},
		{
			// The admin state in a registration is ignored: a node cannot
			// register itself out of draining.
			name: "admin in registration ignored", setup: []cmCmd{cmAdmin("n1", cmDraining)},
			cmd: cmCmd{metaRegisterNode, &shardpb.ClusterNode{Id: "n1", Addr: "a1", PeerAddr: "p1", GossipAddr: "g9", Admin: cmActive}}, delta: 1,
			check: func(t *testing.T, before, after *shardpb.ClusterMap, out any) {
				if got := cmNode(after, "n1").Admin; got != cmDraining {
					t.Fatalf("n1 is %v after re-registering, want draining", got)
				}
			},
		},
		{
			// No ID: refused.
			name: "no id", cmd: cmRegister("", "a5", "g5"), want: api.ErrBadRequest,
		},
		{
			// No address: refused.
			name: "no address", cmd: cmRegister("n5", "", "g5"), want: api.ErrBadRequest,
		},
	})
}

// TestClusterMapRegisterSequence: an address freed by a move or by
// forgetting a node can be taken by another node.
func TestClusterMapRegisterSequence(t *testing.T) {
	l := newMetaLog(t)
	cmMustApply(t, l, cmBase...)
	// n1 leaves its shards first: a node holding replicas keeps its address.
	cmMustApply(t, l, cmSetShard("t", 0, 1, "", "n2", "n3"))
	cmMustApply(t, l, cmRegister("n1", "a9", "g1"), cmRegister("n5", "a1", "g5"))
	// n5 holds no replica: removed, it can be forgotten, and its address reused.
	cmMustApply(t, l, cmAdmin("n5", cmRemoved), cmForget("n5"), cmRegister("n6", "a1", "g6"))
	cm := l.m.clusterMap()
	if cmNode(cm, "n5") != nil || cmNode(cm, "n6").GetAddr() != "a1" || cmNode(cm, "n1").GetAddr() != "a9" {
		t.Fatalf("map %v", cm)
	}
	if cm.Version != cmBaseVersion+6 {
		t.Fatalf("version %d, want %d", cm.Version, cmBaseVersion+6)
	}
	// A forgotten ID may register afresh (it is unknown again), as active.
	cmMustApply(t, l, cmRegister("n5", "a5", "g5"))
	if nd := l.m.node("n5"); nd.GetAdmin() != cmActive {
		t.Fatalf("n5 registered after being forgotten: %v", nd)
	}
}

func TestClusterMapSetNodeAdmin(t *testing.T) {
	wantAdmin := func(id string, a shardpb.NodeAdmin) func(*testing.T, *shardpb.ClusterMap, *shardpb.ClusterMap, any) {
		return func(t *testing.T, before, after *shardpb.ClusterMap, out any) {
			got := cmNode(after, id)
			if got.GetAdmin() != a {
				t.Fatalf("%s is %v, want %v", id, got.GetAdmin(), a)
			}
			// Only the admin state changes.
			b := proto.Clone(cmNode(before, id)).(*shardpb.ClusterNode)
			b.Admin = a
			if !proto.Equal(got, b) {
				t.Fatalf("%s %v, want %v", id, got, b)
			}
			if !proto.Equal(cmOthers(after, "", 0, id), cmOthers(before, "", 0, id)) {
				t.Fatal("other entries changed")
			}
		}
	}
	runCMCases(t, []cmCase{
		{
			// An unknown node: refused, nothing changes.
			name: "unknown", cmd: cmAdmin("n9", cmDraining), want: api.ErrUnknownNode,
		},
		{
			// Draining an active node: draining, version +1.
			name: "drain", cmd: cmAdmin("n1", cmDraining), delta: 1, check: wantAdmin("n1", cmDraining),
		},
		{
			// Activating a draining node: active again, version +1.
			name: "drain then activate", setup: []cmCmd{cmAdmin("n1", cmDraining)},
			cmd: cmAdmin("n1", cmActive), delta: 1, check: wantAdmin("n1", cmActive),
		},
		{
			// Removing a node (the FSM does not check replicas; the admin
			// handler and the scheduler do): removed, version +1, the shard
			// entries naming it unchanged.
			name: "remove", cmd: cmAdmin("n1", cmRemoved), delta: 1, check: wantAdmin("n1", cmRemoved),
		},
		{
			// Removing a draining node works as well.
			name: "drain then remove", setup: []cmCmd{cmAdmin("n1", cmDraining)},
			cmd: cmAdmin("n1", cmRemoved), delta: 1, check: wantAdmin("n1", cmRemoved),
		},
		{
			// A removed node cannot be made active again...
			name: "removed to active", setup: []cmCmd{cmAdmin("n1", cmRemoved)},
			cmd: cmAdmin("n1", cmActive), want: api.ErrNodeConflict,
		},
		{
			// ...nor draining.
			name: "removed to draining", setup: []cmCmd{cmAdmin("n1", cmRemoved)},
			cmd: cmAdmin("n1", cmDraining), want: api.ErrNodeConflict,
		},
	})
}

func TestClusterMapForgetNode(t *testing.T) {
	runCMCases(t, []cmCase{
		{
			// An unknown node: refused.
			name: "unknown", cmd: cmForget("n9"), want: api.ErrUnknownNode,
		},
		{
			// An active node, even one without replicas: refused.
			name: "active", setup: []cmCmd{cmRegister("n5", "a5", "g5")},
			cmd: cmForget("n5"), want: api.ErrBadRequest,
		},
		{
			// A draining node without replicas: refused.
			name: "draining", setup: []cmCmd{cmRegister("n5", "a5", "g5"), cmAdmin("n5", cmDraining)},
			cmd: cmForget("n5"), want: api.ErrBadRequest,
		},
		{
			// A removed node still a voter of t/1: refused.
			name: "removed, in replicas", setup: []cmCmd{cmAdmin("n4", cmRemoved)},
			cmd: cmForget("n4"), want: api.ErrBadRequest,
		},
		{
			// A removed node still being added to t/0: refused.
			name: "removed, adding",
			setup: []cmCmd{
				cmRegister("n5", "a5", "g5"),
				cmSetShard("t", 0, 1, "n5", "n1", "n2", "n3"),
				cmAdmin("n5", cmRemoved),
			},
			cmd: cmForget("n5"), want: api.ErrBadRequest,
		},
		{
			// A removed node of several shards: refused.
			name: "removed, in several shards", setup: []cmCmd{cmAdmin("n2", cmRemoved)},
			cmd: cmForget("n2"), want: api.ErrBadRequest,
		},
		{
			// A removed node without replicas: gone from the map, version +1,
			// nothing else changed.
			name: "removed, no replicas", setup: []cmCmd{cmRegister("n5", "a5", "g5"), cmAdmin("n5", cmRemoved)},
			cmd: cmForget("n5"), delta: 1,
			check: func(t *testing.T, before, after *shardpb.ClusterMap, out any) {
				if cmNode(after, "n5") != nil || len(after.Nodes) != 4 {
					t.Fatalf("nodes after forgetting n5: %v", after.Nodes)
				}
				if !proto.Equal(cmOthers(after, "", 0), cmOthers(before, "", 0, "n5")) {
					t.Fatal("forgetting n5 changed other entries")
				}
			},
		},
		{
			// A removed node taken out of its only shard: can be forgotten.
			name: "removed, moved out",
			setup: []cmCmd{
				cmAdmin("n4", cmRemoved),
				cmRegister("n5", "a5", "g5"),
				cmSetShard("t", 1, 1, "", "n2", "n3", "n5"),
			},
			cmd: cmForget("n4"), delta: 1,
			check: func(t *testing.T, before, after *shardpb.ClusterMap, out any) {
				if cmNode(after, "n4") != nil {
					t.Fatal("n4 still in the map")
				}
			},
		},
	})
}

func TestClusterMapCreateTable(t *testing.T) {
	runCMCases(t, []cmCase{
		{
			// A new table: its spec and one entry per shard, at epoch 1 and
			// under the table's name whatever the command's entries say;
			// version +1 for the whole creation.
			name: "new table",
			cmd: cmCmd{metaCreateTableV2, &shardpb.MetaCreateTable{
				Spec: &shardpb.TableSpec{Name: "u", Dim: 8, Shards: 3, Replicas: 2, Optimizer: "adam"},
				Shards: []*shardpb.ShardMap{
					{Table: "u", Shard: 0, Replicas: []string{"n1", "n2"}},
					{Table: "x", Shard: 1, Replicas: []string{"n3", "n4"}, Epoch: 7},
					{Shard: 2, Replicas: []string{"n4", "n1"}, Adding: "n2", Epoch: 0},
				},
			}},
			delta: 1,
			check: func(t *testing.T, before, after *shardpb.ClusterMap, out any) {
				spec := &shardpb.TableSpec{Name: "u", Dim: 8, Shards: 3, Replicas: 2, Optimizer: "adam"}
				if !proto.Equal(cmTable(after, "u"), spec) || !proto.Equal(out.(proto.Message), spec) {
					t.Fatalf("table u %v, returned %v; want %v", cmTable(after, "u"), out, spec)
				}
				for s, want := range []*shardpb.ShardMap{
					{Table: "u", Shard: 0, Replicas: []string{"n1", "n2"}, Epoch: 1},
					{Table: "u", Shard: 1, Replicas: []string{"n3", "n4"}, Epoch: 1},
					{Table: "u", Shard: 2, Replicas: []string{"n4", "n1"}, Adding: "n2", Epoch: 1},
				} {
					if got := cmShard(after, "u", uint32(s)); !proto.Equal(got, want) {
						t.Errorf("u/%d %v, want %v", s, got, want)
					}
				}
				if cmShard(after, "x", 1) != nil || len(after.Shards) != 5 {
					t.Fatalf("shards %v", after.Shards)
				}
				if !proto.Equal(cmShard(after, "t", 0), cmShard(before, "t", 0)) || !proto.Equal(cmShard(after, "t", 1), cmShard(before, "t", 1)) {
					t.Fatal("table t's entries changed")
				}
			},
		},
		{
			// A second creation of the same name: store.ErrTableExists,
			// neither the spec nor the entries change.
			name: "exists", cmd: cmCreate("t", 1, []string{"n4"}), want: store.ErrTableExists,
		},
		{
			// The same, with the very same command as the first creation.
			name: "exists, same command", cmd: cmBase[len(cmBase)-1], want: store.ErrTableExists,
		},
		{
			// Fewer shard entries than spec.Shards: refused.
			name: "too few entries",
			cmd: cmCmd{metaCreateTableV2, &shardpb.MetaCreateTable{
				Spec:   &shardpb.TableSpec{Name: "u", Dim: 4, Shards: 3, Replicas: 1},
				Shards: []*shardpb.ShardMap{{Shard: 0, Replicas: []string{"n1"}}, {Shard: 1, Replicas: []string{"n2"}}},
			}},
			want: api.ErrBadRequest,
		},
		{
			// More shard entries than spec.Shards: refused.
			name: "too many entries",
			cmd: cmCmd{metaCreateTableV2, &shardpb.MetaCreateTable{
				Spec:   &shardpb.TableSpec{Name: "u", Dim: 4, Shards: 1, Replicas: 1},
				Shards: []*shardpb.ShardMap{{Shard: 0, Replicas: []string{"n1"}}, {Shard: 1, Replicas: []string{"n2"}}},
			}},
			want: api.ErrBadRequest,
		},
		{
			// An existing name with a wrong count: refused all the same.
			name: "exists, wrong count",
			cmd: cmCmd{metaCreateTableV2, &shardpb.MetaCreateTable{
				Spec: &shardpb.TableSpec{Name: "t", Dim: 4, Shards: 2, Replicas: 1},
			}},
			want: api.ErrBadRequest,
		},
		{
			// No spec: refused.
			name: "no spec", cmd: cmCmd{metaCreateTableV2, &shardpb.MetaCreateTable{}}, want: api.ErrBadRequest,
		},
	})
}

func TestClusterMapSetShard(t *testing.T) {
	// wantEntry: the entry is want, and every other entry and node is as before.
	wantEntry := func(want *shardpb.ShardMap) func(*testing.T, *shardpb.ClusterMap, *shardpb.ClusterMap, any) {
		return func(t *testing.T, before, after *shardpb.ClusterMap, out any) {
			got := cmShard(after, want.Table, want.Shard)
			if !proto.Equal(got, want) || !proto.Equal(out.(proto.Message), want) {
				t.Fatalf("entry %v, returned %v; want %v", got, out, want)
			}
			if !proto.Equal(cmOthers(after, want.Table, want.Shard), cmOthers(before, want.Table, want.Shard)) {
				t.Fatal("other entries changed")
			}
		}
	}
	moved := cmSetShard("t", 0, 1, "", "n2", "n1", "n3") // t/0 at epoch 2
	runCMCases(t, []cmCase{
		{
			// The right epoch: replicas and adding replaced, epoch 2, version +1.
			name: "cas succeeds", setup: []cmCmd{cmRegister("n5", "a5", "g5")},
			cmd: cmSetShard("t", 0, 1, "n5", "n4", "n1"), delta: 1,
			check: wantEntry(&shardpb.ShardMap{Table: "t", Shard: 0, Replicas: []string{"n4", "n1"}, Adding: "n5", Epoch: 2}),
		},
		{
			// A stale epoch (decided before the entry's last change): refused.
			name: "stale epoch", setup: []cmCmd{moved},
			cmd: cmSetShard("t", 0, 1, "", "n1", "n2", "n4"), want: api.ErrEpochChanged,
		},
		{
			// The same command as the one that just succeeded (a replay by a
			// second scheduler): refused.
			name: "same change twice", setup: []cmCmd{moved}, cmd: moved, want: api.ErrEpochChanged,
		},
		{
			// An epoch from the future: refused as well.
			name: "future epoch", cmd: cmSetShard("t", 0, 2, "", "n1"), want: api.ErrEpochChanged,
		},
		{
			// Epoch 0 (never valid: entries start at 1): refused.
			name: "epoch 0", cmd: cmSetShard("t", 0, 0, "", "n1"), want: api.ErrEpochChanged,
		},
		{
			// The current epoch after a change: epoch 3.
			name: "cas after change", setup: []cmCmd{moved},
			cmd: cmSetShard("t", 0, 2, "", "n3"), delta: 1,
			check: wantEntry(&shardpb.ShardMap{Table: "t", Shard: 0, Replicas: []string{"n3"}, Epoch: 3}),
		},
		{
			// Clearing adding (the add finished): adding empty.
			name:  "clear adding",
			setup: []cmCmd{cmRegister("n5", "a5", "g5"), cmSetShard("t", 1, 1, "n5", "n2", "n3", "n4")},
			cmd:   cmSetShard("t", 1, 2, "", "n2", "n3", "n4", "n5"), delta: 1,
			check: wantEntry(&shardpb.ShardMap{Table: "t", Shard: 1, Replicas: []string{"n2", "n3", "n4", "n5"}, Epoch: 3}),
		},
		{
			// Only the order changes (a new preferred leader): still a change.
			name: "reorder", cmd: cmSetShard("t", 1, 1, "", "n4", "n3", "n2"), delta: 1,
			check: wantEntry(&shardpb.ShardMap{Table: "t", Shard: 1, Replicas: []string{"n4", "n3", "n2"}, Epoch: 2}),
		},
		{
			// An empty replica set: refused.
			name: "empty replicas", cmd: cmSetShard("t", 0, 1, ""), want: api.ErrBadRequest,
		},
		{
			// An empty replica set with a node being added: refused too.
			name: "empty replicas with adding", cmd: cmSetShard("t", 0, 1, "n4"), want: api.ErrBadRequest,
		},
		{
			// An unknown node among the replicas: refused.
			name: "unknown replica", cmd: cmSetShard("t", 0, 1, "", "n1", "n9"), want: api.ErrUnknownNode,
		},
		{
			// An unknown node being added: refused.
			name: "unknown adding", cmd: cmSetShard("t", 0, 1, "n9", "n1", "n2"), want: api.ErrUnknownNode,
		},
		{
			// A forgotten node: unknown.
			name:  "forgotten node",
			setup: []cmCmd{cmRegister("n5", "a5", "g5"), cmAdmin("n5", cmRemoved), cmForget("n5")},
			cmd:   cmSetShard("t", 0, 1, "n5", "n1"), want: api.ErrUnknownNode,
		},
		{
			// A shard number past the table's: unknown shard.
			name: "unknown shard", cmd: cmSetShard("t", 2, 1, "", "n1"), want: api.ErrUnknownShard,
		},
		{
			// A table that does not exist: unknown shard.
			name: "unknown table", cmd: cmSetShard("nope", 0, 1, "", "n1"), want: api.ErrUnknownShard,
		},
		{
			// A table created by the old command (no placement): unknown shard.
			name:  "table without map",
			setup: []cmCmd{{metaCreateTable, &shardpb.TableSpec{Name: "old", Dim: 4, Shards: 1, Replicas: 1}}},
			cmd:   cmSetShard("old", 0, 0, "", "n1"), want: api.ErrUnknownShard,
		},
	})
}

// cmState builds a state with every kind of content: tables with and without
// map entries, jobs, nodes in every admin state, entries at several epochs
// with a node being added, a forgotten node.
func cmState(t *testing.T, l *metaLog) {
	t.Helper()
	cmMustApply(t, l, cmBase...)
	cmMustApply(t, l,
		cmCmd{metaCreateTable, &shardpb.TableSpec{Name: "legacy", Dim: 2, Shards: 1, Replicas: 1}},
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
	want := l.m.clusterMap()
	if want.Version != cmBaseVersion+13 || len(want.Nodes) != 6 || len(want.Shards) != 5 || len(want.Tables) != 3 {
		t.Fatalf("unexpected state to snapshot: %v", want)
	}
	b := snapshotBytes(t, l.m)
	if binary.LittleEndian.Uint32(b) != metaSnapshotMarker || binary.LittleEndian.Uint32(b[4:]) != 3 {
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
	if got := r.m.clusterMap(); !proto.Equal(got, want) {
		t.Fatalf("restored map\n got %v\nwant %v", got, want)
	}
	if r.m.version() != want.Version {
		t.Fatalf("restored version %d, want %d", r.m.version(), want.Version)
	}
	for _, pair := range []struct{ got, want []proto.Message }{
		{msgs(r.m.list()), msgs(l.m.list())},
		{msgs(r.m.jobList()), msgs(l.m.jobList())},
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
	if cm := l.m.clusterMap(); !proto.Equal(cm, r.m.clusterMap()) || cmNode(cm, "n6") != nil || cmNode(cm, "n7") == nil {
		t.Fatalf("after more commands: original %v, restored %v", cm, r.m.clusterMap())
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
	b := binary.LittleEndian.AppendUint32(nil, metaSnapshotMarker)
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
	if got := l.m.clusterMap(); !proto.Equal(got, want) {
		t.Fatalf("restored map\n got %v\nwant %v", got, want)
	}
	if jobs := l.m.jobList(); len(jobs) != 1 || !proto.Equal(jobs[0], old.Jobs[0]) {
		t.Fatalf("restored jobs %v, want %v", jobs, old.Jobs)
	}
	// The tables have no entries; nodes can register from version 0.
	if err, _ := l.apply(metaSetShard, &shardpb.MetaSetShard{Table: "a", Shard: 0, ExpectEpoch: 1, Replicas: []string{"n1"}}).(error); !errors.Is(err, api.ErrUnknownShard) {
		t.Fatalf("changing a table without entries: %v, want api.ErrUnknownShard", err)
	}
	cmMustApply(t, l, cmRegister("n1", "a1", "g1"))
	if v := l.m.version(); v != 1 {
		t.Fatalf("version %d after one registration, want 1", v)
	}
	// Snapshotting again writes format 3, which restores the same.
	b3 := snapshotBytes(t, l.m)
	if binary.LittleEndian.Uint32(b3[4:]) != 3 {
		t.Fatal("not format 3")
	}
	m := newMetaFSM(func() {})
	if err := restore(m, b3); err != nil || !proto.Equal(m.clusterMap(), l.m.clusterMap()) {
		t.Fatalf("format 3 after format 2: %v, %v", err, m.clusterMap())
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
			epoch := a.m.shardMap(table, shard).GetEpoch()
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
	t.Logf("%d commands accepted, %d refused; map version %d", accepted, refused, a.m.version())
	if refused < 300 || accepted < 300 {
		t.Fatalf("%d accepted, %d refused: the sequence does not exercise both", accepted, refused)
	}
	want := a.m.clusterMap()
	for _, r := range []*metaLog{b, c} {
		if got := r.m.clusterMap(); !proto.Equal(got, want) {
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
