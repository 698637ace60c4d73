package meta

import (
	"errors"
	"testing"
	"time"

	"github.com/raftps/raftps/shard/api"
	"github.com/raftps/raftps/shard/shardpb"
	"github.com/raftps/raftps/store"
	"google.golang.org/protobuf/proto"
)

// TestMetaAlterTable checks that an alter changes only what it may, on the
// state it applies to, and survives a snapshot.
func TestMetaAlterTable(t *testing.T) {
	l := newMetaLog(t)
	spec, err := api.NormalizeSpec(&shardpb.TableSpec{Name: "t", Dim: 4})
	if err != nil {
		t.Fatal(err)
	}
	if out := l.apply(CmdCreateTable, spec); out != spec {
		if err, ok := out.(error); ok {
			t.Fatal(err)
		}
	}
	next, err := api.AlterSpec(spec, &shardpb.AlterTableRequest{Name: "t", Consistency: shardpb.Consistency_CONSISTENCY_BOUNDED,
		StalenessBoundNs: int64(50 * time.Millisecond), SetHot: true, HotThreshold: 500})
	if err != nil {
		t.Fatal(err)
	}
	if err, ok := l.apply(CmdAlterTable, next).(error); ok {
		t.Fatal(err)
	}
	got := l.m.Table("t")
	if got.Consistency != shardpb.Consistency_CONSISTENCY_BOUNDED || got.StalenessBoundNs != int64(50*time.Millisecond) ||
		got.HotThreshold != 500 || got.HotReplicas != api.DefaultHotReplicas {
		t.Fatalf("altered spec %v", got)
	}
	// Anything else changed is refused, and changes nothing.
	worse := proto.Clone(got).(*shardpb.TableSpec)
	worse.Dim = 8
	if err, ok := l.apply(CmdAlterTable, worse).(error); !ok || !errors.Is(err, store.ErrInvalidConfig) {
		t.Errorf("alter of dim: %v, want ErrInvalidConfig", err)
	}
	if !proto.Equal(l.m.Table("t"), got) {
		t.Error("a refused alter changed the spec")
	}
	unknown := proto.Clone(got).(*shardpb.TableSpec)
	unknown.Name = "u"
	if err, ok := l.apply(CmdAlterTable, unknown).(error); !ok || !errors.Is(err, store.ErrUnknownTable) {
		t.Errorf("alter of an unknown table: %v", err)
	}
	// Without a level, the request keeps the table's; hot keys off clears
	// the replicas too.
	off, err := api.AlterSpec(got, &shardpb.AlterTableRequest{Name: "t", SetHot: true})
	if err != nil || off.HotThreshold != 0 || off.HotReplicas != 0 || off.Consistency != shardpb.Consistency_CONSISTENCY_BOUNDED {
		t.Errorf("hot keys off: %v, %v", off, err)
	}
	if _, err := api.AlterSpec(got, &shardpb.AlterTableRequest{Name: "t", Consistency: shardpb.Consistency_CONSISTENCY_EVENTUAL, StalenessBoundNs: 1e9}); err == nil {
		t.Error("eventual with a bound was accepted")
	}
	// The altered spec survives a snapshot.
	m2 := New(func() {})
	if err := restore(m2, snapshotBytes(t, l.m)); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(m2.Table("t"), got) {
		t.Errorf("after a snapshot: %v, want %v", m2.Table("t"), got)
	}
}
