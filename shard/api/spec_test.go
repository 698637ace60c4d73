package api

import (
	"cmp"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/raftps/raftps/shard/shardpb"
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
		if _, err := NormalizeSpec(s); err != nil {
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
		if _, err := NormalizeSpec(s); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: %v, want ErrInvalidConfig", name, err)
		}
	}
	s := base()
	s.HotThreshold = 10
	n, _ := NormalizeSpec(s)
	if n.HotReplicas != DefaultHotReplicas {
		t.Errorf("hot replicas default %d, want %d", n.HotReplicas, DefaultHotReplicas)
	}
}

func TestNormalizeSpecReplication(t *testing.T) {
	for _, r := range []string{"", ReplicationRaft, ReplicationChain} {
		s, err := NormalizeSpec(&shardpb.TableSpec{Name: "t", Dim: 4, Replication: r})
		if err != nil {
			t.Fatalf("replication %q: %v", r, err)
		}
		if want := cmp.Or(r, ReplicationRaft); s.Replication != want {
			t.Errorf("replication %q stored as %q, want %q", r, s.Replication, want)
		}
	}
	bad := &shardpb.TableSpec{Name: "t", Dim: 4, Replication: "paxos"}
	if _, err := NormalizeSpec(bad); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "replication") {
		t.Errorf("spec %v: err = %v, want ErrInvalidConfig naming replication", bad, err)
	}
	// Chain tables take hot keys, at creation or later, with the default
	// number of read replicas.
	if s, err := NormalizeSpec(&shardpb.TableSpec{Name: "t", Dim: 4, Replication: ReplicationChain, HotThreshold: 10}); err != nil || s.HotReplicas != DefaultHotReplicas {
		t.Errorf("chain table with hot keys: %v, %v; want %d read replicas", s, err, DefaultHotReplicas)
	}
	chain, _ := NormalizeSpec(&shardpb.TableSpec{Name: "t", Dim: 4, Replication: ReplicationChain})
	if s, err := AlterSpec(chain, &shardpb.AlterTableRequest{Name: "t", SetHot: true, HotThreshold: 5}); err != nil || s.HotThreshold != 5 || s.Replication != ReplicationChain {
		t.Errorf("alter hot on a chain table: %v, %v", s, err)
	}
}

// TestTableNames: the names of the reproduction (".", "..", "3",
// ".x", "a/b", 300 bytes) and anything else that is a path component with a
// meaning are refused with ErrInvalidConfig; the names the tests, demo,
// bench, docs and trainer use stay valid.
func TestTableNames(t *testing.T) {
	for _, bad := range []string{"", ".", "..", "3", "007", ".x", "a/b", "/", "a\\b", strings.Repeat("a", 300),
		strings.Repeat("a", MaxTableNameLen+1), "Users", "_x", "-x", "a b", "a\x00", "é", "emb/0"} {
		if _, err := NormalizeSpec(&shardpb.TableSpec{Name: bad, Dim: 4}); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("table %q: got %v, want ErrInvalidConfig", bad, err)
		}
	}
	for _, good := range []string{"t", "emb", "users", "chaos_lin", "chaos-x", "lr.state", "train_dlrm.dense", "bench", "t3", "a..b", "x.",
		strings.Repeat("a", MaxTableNameLen)} {
		if err := CheckTableName(good); err != nil {
			t.Errorf("table %q: %v", good, err)
		}
	}
	if err := CheckTableName(strings.Repeat("a", 300)); err == nil || len(err.Error()) > 300 {
		t.Errorf("a 300-byte name's error should be refused and not repeat the whole name: %v", err)
	}
}
