package shard

import (
	"cmp"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/raftps/raftps/shard/shardpb"
	"github.com/raftps/raftps/store"
	"google.golang.org/protobuf/proto"
)

func TestNormalizeSpecLevels(t *testing.T) {
	base := func() *shardpb.TableSpec { return &shardpb.TableSpec{Name: "t", Dim: 4} }
	ok := []func(*shardpb.TableSpec){
		func(s *shardpb.TableSpec) {},
		func(s *shardpb.TableSpec) {
			s.Consistency, s.StalenessBoundNs = shardpb.Consistency_CONSISTENCY_BOUNDED, int64(100*time.Millisecond)
		},
		func(s *shardpb.TableSpec) { s.Consistency = shardpb.Consistency_CONSISTENCY_EVENTUAL },
		func(s *shardpb.TableSpec) { s.HotThreshold = 100 },
	}
	for i, f := range ok {
		s := base()
		f(s)
		if _, err := normalizeSpec(s); err != nil {
			t.Errorf("case %d: %v", i, err)
		}
	}
	bad := map[string]func(*shardpb.TableSpec){
		"bounded without a bound": func(s *shardpb.TableSpec) { s.Consistency = shardpb.Consistency_CONSISTENCY_BOUNDED },
		"bound too small": func(s *shardpb.TableSpec) {
			s.Consistency, s.StalenessBoundNs = shardpb.Consistency_CONSISTENCY_BOUNDED, int64(time.Millisecond)
		},
		"bound too large": func(s *shardpb.TableSpec) {
			s.Consistency, s.StalenessBoundNs = shardpb.Consistency_CONSISTENCY_BOUNDED, int64(2*time.Hour)
		},
		"bound on a linearizable table": func(s *shardpb.TableSpec) { s.StalenessBoundNs = int64(time.Second) },
		"unknown level":                 func(s *shardpb.TableSpec) { s.Consistency = 9 },
		"NaN threshold":                 func(s *shardpb.TableSpec) { s.HotThreshold = math.NaN() },
		"negative threshold":            func(s *shardpb.TableSpec) { s.HotThreshold = -1 },
		"too many hot replicas":         func(s *shardpb.TableSpec) { s.HotThreshold, s.HotReplicas = 1, MaxHotReplicas+1 },
	}
	for name, f := range bad {
		s := base()
		f(s)
		if _, err := normalizeSpec(s); !errors.Is(err, store.ErrInvalidConfig) {
			t.Errorf("%s: %v, want ErrInvalidConfig", name, err)
		}
	}
	s := base()
	s.HotThreshold = 10
	n, _ := normalizeSpec(s)
	if n.HotReplicas != DefaultHotReplicas {
		t.Errorf("hot replicas default %d, want %d", n.HotReplicas, DefaultHotReplicas)
	}
}

// TestMetaAlterTable checks that an alter changes only what it may, on the
// state it applies to, and survives a snapshot.
func TestMetaAlterTable(t *testing.T) {
	l := newMetaLog(t)
	spec, err := normalizeSpec(&shardpb.TableSpec{Name: "t", Dim: 4})
	if err != nil {
		t.Fatal(err)
	}
	if out := l.apply(metaCreateTable, spec); out != spec {
		if err, ok := out.(error); ok {
			t.Fatal(err)
		}
	}
	next, err := alterSpec(spec, &shardpb.AlterTableRequest{Name: "t", Consistency: shardpb.Consistency_CONSISTENCY_BOUNDED,
		StalenessBoundNs: int64(50 * time.Millisecond), SetHot: true, HotThreshold: 500})
	if err != nil {
		t.Fatal(err)
	}
	if err, ok := l.apply(metaAlterTable, next).(error); ok {
		t.Fatal(err)
	}
	got := l.m.table("t")
	if got.Consistency != shardpb.Consistency_CONSISTENCY_BOUNDED || got.StalenessBoundNs != int64(50*time.Millisecond) ||
		got.HotThreshold != 500 || got.HotReplicas != DefaultHotReplicas {
		t.Fatalf("altered spec %v", got)
	}
	// Anything else changed is refused, and changes nothing.
	worse := proto.Clone(got).(*shardpb.TableSpec)
	worse.Dim = 8
	if err, ok := l.apply(metaAlterTable, worse).(error); !ok || !errors.Is(err, store.ErrInvalidConfig) {
		t.Errorf("alter of dim: %v, want ErrInvalidConfig", err)
	}
	if !proto.Equal(l.m.table("t"), got) {
		t.Error("a refused alter changed the spec")
	}
	unknown := proto.Clone(got).(*shardpb.TableSpec)
	unknown.Name = "u"
	if err, ok := l.apply(metaAlterTable, unknown).(error); !ok || !errors.Is(err, store.ErrUnknownTable) {
		t.Errorf("alter of an unknown table: %v", err)
	}
	// Without a level, the request keeps the table's; hot keys off clears
	// the replicas too.
	off, err := alterSpec(got, &shardpb.AlterTableRequest{Name: "t", SetHot: true})
	if err != nil || off.HotThreshold != 0 || off.HotReplicas != 0 || off.Consistency != shardpb.Consistency_CONSISTENCY_BOUNDED {
		t.Errorf("hot keys off: %v, %v", off, err)
	}
	if _, err := alterSpec(got, &shardpb.AlterTableRequest{Name: "t", Consistency: shardpb.Consistency_CONSISTENCY_EVENTUAL, StalenessBoundNs: 1e9}); err == nil {
		t.Error("eventual with a bound was accepted")
	}
	// The altered spec survives a snapshot.
	m2 := newMetaFSM(func() {})
	if err := restore(m2, snapshotBytes(t, l.m)); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(m2.table("t"), got) {
		t.Errorf("after a snapshot: %v, want %v", m2.table("t"), got)
	}
}

func TestNormalizeSpecReplication(t *testing.T) {
	for _, r := range []string{"", ReplicationRaft, ReplicationChain} {
		s, err := normalizeSpec(&shardpb.TableSpec{Name: "t", Dim: 4, Replication: r})
		if err != nil {
			t.Fatalf("replication %q: %v", r, err)
		}
		if want := cmp.Or(r, ReplicationRaft); s.Replication != want {
			t.Errorf("replication %q stored as %q, want %q", r, s.Replication, want)
		}
	}
	bad := &shardpb.TableSpec{Name: "t", Dim: 4, Replication: "paxos"}
	if _, err := normalizeSpec(bad); !errors.Is(err, store.ErrInvalidConfig) || !strings.Contains(err.Error(), "replication") {
		t.Errorf("spec %v: err = %v, want ErrInvalidConfig naming replication", bad, err)
	}
	// Chain tables take hot keys, at creation or later, with the default
	// number of read replicas.
	if s, err := normalizeSpec(&shardpb.TableSpec{Name: "t", Dim: 4, Replication: ReplicationChain, HotThreshold: 10}); err != nil || s.HotReplicas != DefaultHotReplicas {
		t.Errorf("chain table with hot keys: %v, %v; want %d read replicas", s, err, DefaultHotReplicas)
	}
	chain, _ := normalizeSpec(&shardpb.TableSpec{Name: "t", Dim: 4, Replication: ReplicationChain})
	if s, err := alterSpec(chain, &shardpb.AlterTableRequest{Name: "t", SetHot: true, HotThreshold: 5}); err != nil || s.HotThreshold != 5 || s.Replication != ReplicationChain {
		t.Errorf("alter hot on a chain table: %v, %v", s, err)
	}
}
