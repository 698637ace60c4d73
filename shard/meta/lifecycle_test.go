package meta

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/raftps/raftps/shard/api"
	"github.com/raftps/raftps/shard/shardpb"
)

func dropCmd(name string, force bool) cmCmd {
	return cmCmd{CmdDropTable, &shardpb.DropTableRequest{Name: name, Force: force}}
}

func joinV2(job string, world, rank int, addr string, maxJobs uint32, tables ...string) cmCmd {
	return cmCmd{CmdJoinJobV2, &shardpb.MetaJoinJob{MaxJobs: maxJobs,
		Join: &shardpb.JoinJobRequest{Job: job, World: uint32(world), Rank: int32(rank), Addr: addr, Tables: tables}}}
}

// TestDropTable: a drop removes the table's spec and every one of its shard
// entries and nothing else; it is refused while a job lists the table
// unless forced; the name can be created again, with a new incarnation, so
// that no node mistakes the old replicas for the new table's.
func TestDropTable(t *testing.T) {
	l := newMetaLog(t)
	cmMustApply(t, l, cmBase...)
	cmMustApply(t, l, cmCreate("u", 2, []string{"n1", "n2"}))
	oldInc := l.m.ShardMap("t", 0).GetIncarnation()
	cmMustApply(t, l, joinV2("job", 2, 0, "h:1", 0, "t", "t.state"))
	if got := l.m.Job("job").GetTables(); strings.Join(got, ",") != "t,t.state" {
		t.Fatalf("job tables %v", got)
	}
	before := snapshotBytes(t, l.m)
	err, _ := l.apply(dropCmd("t", false).cmd, dropCmd("t", false).arg).(error)
	if !errors.Is(err, api.ErrTableInUse) || !strings.Contains(err.Error(), `job "job"`) {
		t.Fatalf("drop of a table a job lists: %v, want ErrTableInUse naming the job", err)
	}
	if string(snapshotBytes(t, l.m)) != string(before) {
		t.Fatal("a refused drop changed the state")
	}
	if err, _ := l.apply(CmdDropTable, &shardpb.DropTableRequest{Name: "nope"}).(error); !errors.Is(err, api.ErrUnknownTable) {
		t.Fatalf("drop of an unknown table: %v", err)
	}
	v := l.m.Version()
	cmMustApply(t, l, dropCmd("t", true))
	cm := l.m.ClusterMap()
	if l.m.Table("t") != nil || l.m.ShardMap("t", 0) != nil || l.m.ShardMap("t", 1) != nil {
		t.Fatalf("table t still in the map after its drop: %v", cm)
	}
	if l.m.Table("u") == nil || l.m.ShardMap("u", 0) == nil || len(cm.Shards) != 1 || len(cm.Nodes) != 4 {
		t.Fatalf("the drop of t changed other entries: %v", cm)
	}
	if l.m.Version() != v+1 {
		t.Fatalf("map version %d after a drop, want %d", l.m.Version(), v+1)
	}
	// The job stays (it may still run); its table can be created again.
	cmMustApply(t, l, cmCreate("t", 1, []string{"n4"}))
	if inc := l.m.ShardMap("t", 0).GetIncarnation(); inc == oldInc || inc == 0 {
		t.Fatalf("re-created table's incarnation %d, the dropped one's %d", inc, oldInc)
	}
	// Snapshot and restore keep it all, the cluster ID included.
	cmMustApply(t, l, cmCmd{CmdSetClusterID, &shardpb.MetaClusterID{Id: "c1"}})
	r := New(func() {})
	if err := restore(r, snapshotBytes(t, l.m)); err != nil {
		t.Fatal(err)
	}
	if string(snapshotBytes(t, r)) != string(snapshotBytes(t, l.m)) || r.ClusterID() != "c1" || r.ShardMap("t", 0).GetIncarnation() != l.m.ShardMap("t", 0).GetIncarnation() {
		t.Fatal("restored state differs")
	}
}

// TestQuotas: the limits a command carries hold at their boundary: the
// N-th table, job or replica on a node is admitted, the one after refused
// with ErrQuotaExceeded naming the limit, and a refusal changes nothing.
// A command without limits (an old entry) has none.
func TestQuotas(t *testing.T) {
	l := newMetaLog(t)
	cmMustApply(t, l, cmBase...) // table t: 2 shards, n2 and n3 hold 2 replicas each
	create := func(name string, maxTables, maxPerNode uint32, placement ...[]string) any {
		c := cmCreate(name, uint32(len(placement[0])), placement...)
		mc := c.arg.(*shardpb.MetaCreateTable)
		mc.MaxTables, mc.MaxReplicasPerNode = maxTables, maxPerNode
		return l.apply(c.cmd, c.arg)
	}
	// Tables: 1 exists; a limit of 2 admits one more, then refuses.
	if err, ok := create("a", 2, 0, []string{"n1"}).(error); ok {
		t.Fatal(err)
	}
	before := snapshotBytes(t, l.m)
	err, _ := create("b", 2, 0, []string{"n1"}).(error)
	if !errors.Is(err, api.ErrQuotaExceeded) || !strings.Contains(err.Error(), "limit of tables is 2") {
		t.Fatalf("third table under a limit of 2: %v", err)
	}
	// Replicas per node: n2 holds 2 (t/0, t/1); at a limit of 3 one more
	// fits, two do not.
	err, _ = create("b", 0, 3, []string{"n2"}, []string{"n2"}).(error)
	if !errors.Is(err, api.ErrQuotaExceeded) || !strings.Contains(err.Error(), "node n2") || !strings.Contains(err.Error(), "limit of 3") {
		t.Fatalf("fourth replica on n2 under a limit of 3: %v", err)
	}
	if string(snapshotBytes(t, l.m)) != string(before) {
		t.Fatal("a refused creation changed the state")
	}
	if err, ok := create("b", 0, 3, []string{"n2"}).(error); ok {
		t.Fatal(err)
	}
	if err, ok := create("c", 0, 0, []string{"n2"}).(error); ok {
		t.Fatalf("no limit: %v", err)
	}
	// Jobs: a limit of 2 admits two jobs; a third is refused, but joining
	// an existing job is not a new job.
	cmMustApply(t, l, joinV2("j1", 2, 0, "h:1", 2), joinV2("j2", 1, 0, "h:2", 2), joinV2("j1", 2, 1, "h:3", 2))
	err, _ = l.apply(joinV2("j3", 1, 0, "h:4", 2).cmd, joinV2("j3", 1, 0, "h:4", 2).arg).(error)
	if !errors.Is(err, api.ErrQuotaExceeded) || !strings.Contains(err.Error(), "limit of jobs is 2") {
		t.Fatalf("third job under a limit of 2: %v", err)
	}
	cmMustApply(t, l, cmCmd{CmdDeleteJob, &shardpb.DeleteJobRequest{Job: "j2"}}, joinV2("j3", 1, 0, "h:4", 2))
	// A job listing a bad table name or too many tables is refused.
	var many []string
	for i := range MaxJobTables + 1 {
		many = append(many, fmt.Sprintf("t%d", i))
	}
	for _, c := range []cmCmd{joinV2("j4", 1, 0, "h:5", 0, "."), joinV2("j4", 1, 0, "h:5", 0, many...)} {
		if err, _ := l.apply(c.cmd, c.arg).(error); !errors.Is(err, api.ErrBadRequest) {
			t.Errorf("join listing bad tables: %v", err)
		}
	}
}

// TestClusterID: the first ID chosen stays; a later one changes nothing and
// the answer is the ID the cluster has.
func TestClusterID(t *testing.T) {
	l := newMetaLog(t)
	if id := l.m.ClusterID(); id != "" {
		t.Fatalf("new FSM has cluster ID %q", id)
	}
	if out := l.apply(CmdSetClusterID, &shardpb.MetaClusterID{Id: "first"}); out != "first" {
		t.Fatalf("first choice answered %v", out)
	}
	if out := l.apply(CmdSetClusterID, &shardpb.MetaClusterID{Id: "second"}); out != "first" || l.m.ClusterID() != "first" {
		t.Fatalf("second choice answered %v, ID %q", out, l.m.ClusterID())
	}
	for _, bad := range []string{"", strings.Repeat("x", MaxClusterIDLen+1)} {
		if err, _ := l.apply(CmdSetClusterID, &shardpb.MetaClusterID{Id: bad}).(error); !errors.Is(err, api.ErrBadRequest) {
			t.Errorf("cluster ID of %d bytes: %v", len(bad), err)
		}
	}
}
