package shard

import (
	"fmt"
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
		s.Replication = "raft"
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
	case s.Replication != "raft":
		return nil, fmt.Errorf("%w: table %q: replication = %q (only raft is available)", store.ErrInvalidConfig, s.Name, s.Replication)
	case s.Consistency != shardpb.Consistency_CONSISTENCY_LINEARIZABLE && s.Consistency != shardpb.Consistency_CONSISTENCY_EVENTUAL:
		return nil, fmt.Errorf("%w: table %q: consistency %s is not available yet (linearizable or eventual)", store.ErrInvalidConfig, s.Name, s.Consistency)
	case s.StalenessBoundNs != 0:
		return nil, fmt.Errorf("%w: table %q: staleness bound %s given for a %s table", store.ErrInvalidConfig, s.Name, time.Duration(s.StalenessBoundNs), s.Consistency)
	}
	return s, nil
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
