package meta

import (
	"errors"
	"strings"
	"testing"

	"github.com/raftps/raftps/shard/api"
	"github.com/raftps/raftps/shard/shardpb"
)

// TestApplyRefusesBadNames: a log entry that would create or alter a table
// whose name is a path with a meaning (".", "..", digits only, a separator,
// a leading dot, 300 bytes), or register a node with an ID or address the
// rules refuse, is refused on apply and changes nothing; the FSM's state
// afterwards is the state before.
func TestApplyRefusesBadNames(t *testing.T) {
	l := newMetaLog(t)
	cmMustApply(t, l, cmBase...)
	before := snapshotBytes(t, l.m)
	for _, name := range []string{".", "..", "3", ".x", "a/b", strings.Repeat("x", 300)} {
		for _, c := range []cmCmd{
			cmCreate(name, 1, []string{"n1"}),
			{CmdCreateTable, &shardpb.TableSpec{Name: name, Dim: 4, Shards: 1, Replicas: 1}},
			{CmdAlterTable, &shardpb.TableSpec{Name: name, Dim: 4, Shards: 1, Replicas: 1}},
		} {
			err, _ := l.apply(c.cmd, c.arg).(error)
			if !errors.Is(err, api.ErrInvalidConfig) {
				t.Errorf("command %d on table %q: got %v, want ErrInvalidConfig", c.cmd, name, err)
			}
		}
	}
	long := strings.Repeat("h", 100<<10)
	for _, nd := range []*shardpb.ClusterNode{
		{Id: long, Addr: "a9:1", PeerAddr: "p9:1"},
		{Id: "n9", Addr: long + ":1", PeerAddr: "p9:1"},
		{Id: "n9", Addr: "a9:1", PeerAddr: "p9:1", GossipAddr: long + ":1"},
		{Id: "-n9", Addr: "a9:1", PeerAddr: "p9:1"},
		{Id: "n/9", Addr: "a9:1", PeerAddr: "p9:1"},
		{Id: "n9", Addr: "a9", PeerAddr: "p9:1"},
		{Id: "n9", Addr: "a9:1", PeerAddr: "p 9:1"},
		{Id: "n9", Addr: "a9:0", PeerAddr: "p9:1"},
		{Id: "n9", Addr: "a9:1", PeerAddr: ":1"},
	} {
		err, _ := l.apply(CmdRegisterNode, nd).(error)
		if !errors.Is(err, api.ErrBadRequest) {
			t.Errorf("registering %.40v: got %v, want ErrBadRequest", nd, err)
		}
		if err != nil && len(err.Error()) > 1000 {
			t.Errorf("the refusal repeats the whole input: %d bytes", len(err.Error()))
		}
	}
	if after := snapshotBytes(t, l.m); string(after) != string(before) {
		t.Fatal("a refused command changed the state")
	}
	// The rules admit what clusters use: IPv6 and host names.
	cmMustApply(t, l, cmCmd{CmdRegisterNode, &shardpb.ClusterNode{Id: "n9.example_x-1", Addr: "[::1]:7001", PeerAddr: "host-9.example:9001", GossipAddr: "10.0.0.9:8001"}})
}
