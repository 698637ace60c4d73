package meta

import (
	"bytes"
	"errors"
	"testing"

	"github.com/raftps/raftps/shard/api"

	"github.com/raftps/raftps/shard/shardpb"
	"github.com/raftps/raftps/store"
	"google.golang.org/protobuf/proto"
)

// Tests of the cluster map part of the metadata FSM (clustermap.go): node
// registration and admin states, forgetting nodes, table creation with
// placement, the compare-and-set on shard epochs; snapshots and determinism
// in clustermap_snapshot_test.go.
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

// cmRegisterPeer registers node id at the given hosts, each with port 1
// (a node registers host:port addresses: CheckNode).
func cmRegisterPeer(id, addr, peer, gossip string) cmCmd {
	port := func(host string) string {
		if host == "" {
			return ""
		}
		return host + ":1"
	}
	return cmCmd{CmdRegisterNode, &shardpb.ClusterNode{Id: id, Addr: port(addr), PeerAddr: port(peer), GossipAddr: port(gossip)}}
}

// cmPeer is the peer address the tests give client address addr.
func cmPeer(addr string) string {
	if addr == "" {
		return ""
	}
	return "p" + addr[1:]
}

func cmAdmin(id string, a shardpb.NodeAdmin) cmCmd {
	return cmCmd{CmdSetNodeAdmin, &shardpb.SetNodeAdminRequest{Id: id, Admin: a}}
}

func cmForget(id string) cmCmd {
	return cmCmd{CmdForgetNode, &shardpb.SetNodeAdminRequest{Id: id}}
}

func cmSetShard(table string, shard uint32, expect uint64, adding string, replicas ...string) cmCmd {
	return cmCmd{CmdSetShard, &shardpb.MetaSetShard{Table: table, Shard: shard, ExpectEpoch: expect, Replicas: replicas, Adding: adding}}
}

// cmCreate creates table name with one shard entry per element of
// placement (each a replica list).
func cmCreate(name string, replicas uint32, placement ...[]string) cmCmd {
	c := &shardpb.MetaCreateTable{Spec: &shardpb.TableSpec{Name: name, Dim: 4, Shards: uint32(len(placement)), Replicas: replicas}}
	for s, r := range placement {
		c.Shards = append(c.Shards, &shardpb.ShardMap{Table: name, Shard: uint32(s), Replicas: r})
	}
	return cmCmd{CmdCreateTableV2, c}
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
	return &metaLog{t: t, m: New(func() { *changes++ })}
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
			before, snapBefore, changesBefore := l.m.ClusterMap(), snapshotBytes(t, l.m), changes
			out := l.apply(c.cmd.cmd, c.cmd.arg)
			after := l.m.ClusterMap()
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
	cm := l.m.ClusterMap()
	want := &shardpb.ClusterMap{
		Version: cmBaseVersion,
		Nodes: []*shardpb.ClusterNode{
			{Id: "n1", Addr: "a1:1", PeerAddr: "p1:1", GossipAddr: "g1:1"}, {Id: "n2", Addr: "a2:1", PeerAddr: "p2:1", GossipAddr: "g2:1"},
			{Id: "n3", Addr: "a3:1", PeerAddr: "p3:1", GossipAddr: "g3:1"}, {Id: "n4", Addr: "a4:1", PeerAddr: "p4:1", GossipAddr: "g4:1"},
		},
		Shards: []*shardpb.ShardMap{
			// Incarnation: the index of the creation (after 4 registrations).
			{Table: "t", Shard: 0, Replicas: []string{"n1", "n2", "n3"}, Epoch: 1, Incarnation: 5},
			{Table: "t", Shard: 1, Replicas: []string{"n2", "n3", "n4"}, Epoch: 1, Incarnation: 5},
		},
		Tables: []*shardpb.TableSpec{{Name: "t", Dim: 4, Shards: 2, Replicas: 3}},
	}
	if !proto.Equal(cm, want) {
		t.Fatalf("base map\n got %v\nwant %v", cm, want)
	}
	if l.m.Version() != cmBaseVersion {
		t.Fatalf("version() %d, clusterMap().Version %d", l.m.Version(), cm.Version)
	}
}

func TestClusterMapRegisterNode(t *testing.T) {
	runCMCases(t, []cmCase{
		{
			// A new node is in the map, active, with its addresses; version +1.
			name: "new node", cmd: cmRegister("n5", "a5", "g5"), delta: 1,
			check: func(t *testing.T, before, after *shardpb.ClusterMap, out any) {
				want := &shardpb.ClusterNode{Id: "n5", Addr: "a5:1", PeerAddr: "p5:1", GossipAddr: "g5:1", Admin: cmActive}
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
				want := &shardpb.ClusterNode{Id: "n5", Addr: "a9:1", PeerAddr: "p9:1", GossipAddr: "g9:1", Admin: cmDraining}
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
				want := &shardpb.ClusterNode{Id: "n1", Addr: "a9:1", PeerAddr: "p1:1", GossipAddr: "g1:1", Admin: cmActive}
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
				want := &shardpb.ClusterNode{Id: "n5", Addr: "a9:1", PeerAddr: "p9:1", GossipAddr: "g5:1", Admin: cmActive}
				if got := cmNode(after, "n5"); !proto.Equal(got, want) {
					t.Fatalf("n5 %v, want %v", got, want)
				}
			},
		},
		{
			// A new gossip address alone is a change too.
			name: "new gossip address", cmd: cmRegister("n1", "a1", "g9"), delta: 1,
			check: func(t *testing.T, before, after *shardpb.ClusterMap, out any) {
				if got := cmNode(after, "n1").GossipAddr; got != "g9:1" {
					t.Fatalf("gossip address %q, want g9:1", got)
				}
			},
		},
		{
			// The admin state in a registration is ignored: a node cannot
			// register itself out of draining.
			name: "admin in registration ignored", setup: []cmCmd{cmAdmin("n1", cmDraining)},
			cmd: cmCmd{CmdRegisterNode, &shardpb.ClusterNode{Id: "n1", Addr: "a1:1", PeerAddr: "p1:1", GossipAddr: "g9:1", Admin: cmActive}}, delta: 1,
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
	cm := l.m.ClusterMap()
	if cmNode(cm, "n5") != nil || cmNode(cm, "n6").GetAddr() != "a1:1" || cmNode(cm, "n1").GetAddr() != "a9:1" {
		t.Fatalf("map %v", cm)
	}
	if cm.Version != cmBaseVersion+6 {
		t.Fatalf("version %d, want %d", cm.Version, cmBaseVersion+6)
	}
	// A forgotten ID may register afresh (it is unknown again), as active.
	cmMustApply(t, l, cmRegister("n5", "a5", "g5"))
	if nd := l.m.Node("n5"); nd.GetAdmin() != cmActive {
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
			cmd: cmCmd{CmdCreateTableV2, &shardpb.MetaCreateTable{
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
					{Table: "u", Shard: 0, Replicas: []string{"n1", "n2"}, Epoch: 1, Incarnation: 6},
					{Table: "u", Shard: 1, Replicas: []string{"n3", "n4"}, Epoch: 1, Incarnation: 6},
					{Table: "u", Shard: 2, Replicas: []string{"n4", "n1"}, Adding: "n2", Epoch: 1, Incarnation: 6},
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
			cmd: cmCmd{CmdCreateTableV2, &shardpb.MetaCreateTable{
				Spec:   &shardpb.TableSpec{Name: "u", Dim: 4, Shards: 3, Replicas: 1},
				Shards: []*shardpb.ShardMap{{Shard: 0, Replicas: []string{"n1"}}, {Shard: 1, Replicas: []string{"n2"}}},
			}},
			want: api.ErrBadRequest,
		},
		{
			// More shard entries than spec.Shards: refused.
			name: "too many entries",
			cmd: cmCmd{CmdCreateTableV2, &shardpb.MetaCreateTable{
				Spec:   &shardpb.TableSpec{Name: "u", Dim: 4, Shards: 1, Replicas: 1},
				Shards: []*shardpb.ShardMap{{Shard: 0, Replicas: []string{"n1"}}, {Shard: 1, Replicas: []string{"n2"}}},
			}},
			want: api.ErrBadRequest,
		},
		{
			// An existing name with a wrong count: refused all the same.
			name: "exists, wrong count",
			cmd: cmCmd{CmdCreateTableV2, &shardpb.MetaCreateTable{
				Spec: &shardpb.TableSpec{Name: "t", Dim: 4, Shards: 2, Replicas: 1},
			}},
			want: api.ErrBadRequest,
		},
		{
			// No spec: refused.
			name: "no spec", cmd: cmCmd{CmdCreateTableV2, &shardpb.MetaCreateTable{}}, want: api.ErrBadRequest,
		},
	})
}

func TestClusterMapSetShard(t *testing.T) {
	// wantEntry: the entry is want, and every other entry and node is as before.
	wantEntry := func(want *shardpb.ShardMap) func(*testing.T, *shardpb.ClusterMap, *shardpb.ClusterMap, any) {
		return func(t *testing.T, before, after *shardpb.ClusterMap, out any) {
			// A change keeps the entry's incarnation (its table's creation).
			want.Incarnation = cmShard(before, want.Table, want.Shard).GetIncarnation()
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
			setup: []cmCmd{{CmdCreateTable, &shardpb.TableSpec{Name: "old", Dim: 4, Shards: 1, Replicas: 1}}},
			cmd:   cmSetShard("old", 0, 0, "", "n1"), want: api.ErrUnknownShard,
		},
	})
}
