package shard

import (
	"fmt"
	"math"
	"time"

	"github.com/raftps/raftps/shard/shardpb"
	"github.com/raftps/raftps/store"
	"google.golang.org/protobuf/proto"
)

// Limits and defaults of a table spec.
const (
	DefaultShards   = 8
	MaxShards       = 1024
	DefaultReplicas = 3
)

// Replication modes of a table (TableSpec.Replication): every shard is a
// Raft group, or a chain (chain.Chain) whose order and epoch the
// metadata group decides. Fixed at creation: AlterTable cannot change it.
const (
	ReplicationRaft  = "raft"
	ReplicationChain = "chain"
)

// isChain reports whether the table's shards are chains.
func isChain(s *shardpb.TableSpec) bool { return s.GetReplication() == ReplicationChain }

// normalizeSpec validates spec and fills its defaults, returning a copy; the
// error names the field and value at fault.
func normalizeSpec(spec *shardpb.TableSpec) (*shardpb.TableSpec, error) {
	s := proto.Clone(spec).(*shardpb.TableSpec)
	if s.Initializer == "" {
		s.Initializer = "zeros"
	}
	if s.Optimizer == "" {
		s.Optimizer = "sgd"
	}
	if s.Shards == 0 {
		s.Shards = DefaultShards
	}
	if s.Replicas == 0 {
		s.Replicas = DefaultReplicas
	}
	if s.Replication == "" {
		s.Replication = ReplicationRaft
	}
	if s.Consistency == shardpb.Consistency_CONSISTENCY_UNSPECIFIED {
		s.Consistency = shardpb.Consistency_CONSISTENCY_LINEARIZABLE
	}
	cfg, err := tableConfig(s)
	if err != nil {
		return nil, err
	}
	// Canonical spellings, so every node stores and shows the same text.
	s.Initializer, s.Optimizer = cfg.Init.String(), cfg.Optimizer.String()
	switch {
	case s.Shards > MaxShards:
		return nil, fmt.Errorf("%w: table %q: shards = %d (want 1..%d)", store.ErrInvalidConfig, s.Name, s.Shards, MaxShards)
	case s.Replication != ReplicationRaft && s.Replication != ReplicationChain:
		return nil, fmt.Errorf("%w: table %q: replication = %q (want %s or %s)", store.ErrInvalidConfig, s.Name, s.Replication, ReplicationRaft, ReplicationChain)
	}
	if err := checkLevel(s); err != nil {
		return nil, err
	}
	return s, nil
}

// Limits of the mutable settings of a table (see checkLevel).
const (
	MinStalenessBound  = 10 * time.Millisecond
	MaxStalenessBound  = time.Hour
	DefaultHotReplicas = 2
	MaxHotReplicas     = 16
)

// checkLevel validates the settings AlterTable may change and fills their
// defaults in place.
func checkLevel(s *shardpb.TableSpec) error {
	bound := time.Duration(s.StalenessBoundNs)
	switch s.Consistency {
	case shardpb.Consistency_CONSISTENCY_LINEARIZABLE, shardpb.Consistency_CONSISTENCY_EVENTUAL:
		if bound != 0 {
			return fmt.Errorf("%w: table %q: staleness bound %s given for a %s table", store.ErrInvalidConfig, s.Name, bound, levelName(s.Consistency))
		}
	case shardpb.Consistency_CONSISTENCY_BOUNDED:
		if bound < MinStalenessBound || bound > MaxStalenessBound {
			return fmt.Errorf("%w: table %q: staleness bound %s (want %s..%s)", store.ErrInvalidConfig, s.Name, bound, MinStalenessBound, MaxStalenessBound)
		}
	default:
		return fmt.Errorf("%w: table %q: consistency %s", store.ErrInvalidConfig, s.Name, s.Consistency)
	}
	switch t := s.HotThreshold; {
	case math.IsNaN(t) || math.IsInf(t, 0) || t < 0:
		return fmt.Errorf("%w: table %q: hot threshold %v (want pulls a second >= 0; 0 turns hot keys off)", store.ErrInvalidConfig, s.Name, t)
	case s.HotReplicas > MaxHotReplicas:
		return fmt.Errorf("%w: table %q: hot replicas = %d (want 0..%d)", store.ErrInvalidConfig, s.Name, s.HotReplicas, MaxHotReplicas)
	case t > 0 && s.HotReplicas == 0:
		s.HotReplicas = DefaultHotReplicas
	case t == 0:
		s.HotReplicas = 0
	}
	return nil
}

// alterSpec returns spec changed as req asks, validated.
func alterSpec(spec *shardpb.TableSpec, req *shardpb.AlterTableRequest) (*shardpb.TableSpec, error) {
	s := proto.Clone(spec).(*shardpb.TableSpec)
	if req.Consistency != shardpb.Consistency_CONSISTENCY_UNSPECIFIED {
		s.Consistency = req.Consistency
		s.StalenessBoundNs = req.StalenessBoundNs
	} else if req.StalenessBoundNs != 0 {
		s.StalenessBoundNs = req.StalenessBoundNs
	}
	if req.SetHot {
		s.HotThreshold, s.HotReplicas = req.HotThreshold, req.HotReplicas
	}
	if err := checkLevel(s); err != nil {
		return nil, err
	}
	return s, nil
}

// levelName is a level's name as the CLI spells it.
func levelName(c shardpb.Consistency) string {
	switch c {
	case shardpb.Consistency_CONSISTENCY_LINEARIZABLE:
		return "linearizable"
	case shardpb.Consistency_CONSISTENCY_BOUNDED:
		return "bounded"
	case shardpb.Consistency_CONSISTENCY_EVENTUAL:
		return "eventual"
	}
	return c.String()
}

// tableConfig is the store config of every shard of the table.
func tableConfig(s *shardpb.TableSpec) (store.TableConfig, error) {
	in, err := store.ParseInitializer(s.Initializer)
	if err != nil {
		return store.TableConfig{}, fmt.Errorf("table %q: %w", s.Name, err)
	}
	opt, err := store.ParseOptimizer(s.Optimizer)
	if err != nil {
		return store.TableConfig{}, fmt.Errorf("table %q: %w", s.Name, err)
	}
	cfg := store.TableConfig{Name: s.Name, Dim: int(s.Dim), Init: in, Optimizer: opt, Seed: s.Seed}
	return cfg, cfg.Validate()
}

// groupID names a shard's replication group; it is also its directory name.
func groupID(table string, shard uint32) string { return fmt.Sprintf("%s/%d", table, shard) }
