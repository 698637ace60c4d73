package api

import (
	"errors"
	"fmt"
	"math"
	"regexp"
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
// Raft group, or a chain whose order and epoch the metadata group decides.
// Fixed at creation: AlterTable cannot change it.
const (
	ReplicationRaft  = "raft"
	ReplicationChain = "chain"
)

// Gradient precisions of a table (TableSpec.GradPrecision): what a push's
// gradients travel and are logged as. Rows and optimizer state are float32
// either way (store/bf16.go). Fixed at creation; a spec stored before the
// setting existed has none, which is GradFP32.
const (
	GradFP32 = "fp32"
	GradBF16 = "bf16"
)

// Node features: what a node's build can do that an older one cannot,
// gossiped as a bit set (membership.Local.Features), so that the metadata
// leader turns a feature on only once every node has it.
const (
	// FeatureBF16Grads: the node decodes bfloat16 push entries. A bf16
	// table is created only if every node of the map has it: an older
	// replica would refuse those entries while newer ones apply them.
	FeatureBF16Grads uint32 = 1 << 0

	// NodeFeatures is everything this build has.
	NodeFeatures = FeatureBF16Grads
)

// IsBF16 reports whether the table takes its gradients as bfloat16.
func IsBF16(s *shardpb.TableSpec) bool { return s.GetGradPrecision() == GradBF16 }

// Limits of the mutable settings of a table (see CheckLevel).
const (
	MinStalenessBound  = 10 * time.Millisecond
	MaxStalenessBound  = time.Hour
	DefaultHotReplicas = 2
	MaxHotReplicas     = 16
)

// ClockRateAllowance is how much faster real time may pass than a node's
// monotonic clock measures, as a fraction: a bounded read is served only if
// its lease age, scaled up by it, is within the bound (so checkers allow
// the same). Crystal oscillators drift by well under 100 ppm; 1% also
// covers a VM whose clock is slewed.
const ClockRateAllowance = 0.01

// IsChain reports whether the table's shards are chains.
func IsChain(s *shardpb.TableSpec) bool { return s.GetReplication() == ReplicationChain }

// invalid wraps ErrInvalidConfig, and the store's error the problem came
// from, if any (both match errors.Is).
func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
}

// MaxTableNameLen is the longest table name, in bytes.
const MaxTableNameLen = 63

// tableNameRE is what a table may be called. A name is a directory of every
// replica's data dir (groups/NAME/SHARD, chains/NAME/SHARD) and the first
// half of a group ID (NAME/SHARD), so it must never be a path component
// with a meaning of its own: "." and ".." (the data dir itself, its parent),
// a digits-only name (table "." shard 3 would be groups/3, the directory of
// table "3"), a separator, or a hidden file. Lower case only, so that two
// tables never share a directory on a case-insensitive file system. Dots
// inside a name are allowed: a training job keeps its state in JOB.state
// and JOB.dense.
var tableNameRE = regexp.MustCompile(`^[a-z][a-z0-9_.-]{0,62}$`)

// CheckTableName returns an error wrapping ErrInvalidConfig unless name may
// name a table: 1 to 63 bytes of lower-case letters, digits, '_', '-' and
// '.', starting with a letter. Specs are checked by NormalizeSpec, and the
// metadata state machine checks every table command again on apply.
func CheckTableName(name string) error {
	if !tableNameRE.MatchString(name) {
		shown := name
		if len(shown) > MaxTableNameLen+1 {
			shown = shown[:MaxTableNameLen+1] + "..."
		}
		return invalid("table name %q (%d bytes): want 1 to %d lower-case letters, digits, '_', '-' or '.', starting with a letter", shown, len(name), MaxTableNameLen)
	}
	return nil
}

// NormalizeSpec validates spec and fills its defaults, returning a copy; the
// error wraps ErrInvalidConfig and names the field and value at fault.
// Servers store what it returns; a client that compares a spec with a
// stored one normalizes it first.
func NormalizeSpec(spec *shardpb.TableSpec) (*shardpb.TableSpec, error) {
	if err := CheckTableName(spec.GetName()); err != nil {
		return nil, err
	}
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
	if s.GradPrecision == "" {
		s.GradPrecision = GradFP32
	}
	cfg, err := TableConfig(s)
	if err != nil {
		return nil, err
	}
	// Canonical spellings, so every node stores and shows the same text.
	s.Initializer, s.Optimizer = cfg.Init.String(), cfg.Optimizer.String()
	switch {
	case s.Shards > MaxShards:
		return nil, invalid("table %q: shards = %d (want 1..%d)", s.Name, s.Shards, MaxShards)
	case s.Replication != ReplicationRaft && s.Replication != ReplicationChain:
		return nil, invalid("table %q: replication = %q (want %s or %s)", s.Name, s.Replication, ReplicationRaft, ReplicationChain)
	case s.GradPrecision != GradFP32 && s.GradPrecision != GradBF16:
		return nil, invalid("table %q: grad precision = %q (want %s or %s)", s.Name, s.GradPrecision, GradFP32, GradBF16)
	}
	if err := CheckLevel(s); err != nil {
		return nil, err
	}
	return s, nil
}

// CheckLevel validates the settings AlterTable may change and fills their
// defaults in place.
func CheckLevel(s *shardpb.TableSpec) error {
	bound := time.Duration(s.StalenessBoundNs)
	switch s.Consistency {
	case shardpb.Consistency_CONSISTENCY_LINEARIZABLE, shardpb.Consistency_CONSISTENCY_EVENTUAL:
		if bound != 0 {
			return invalid("table %q: staleness bound %s given for a %s table", s.Name, bound, LevelName(s.Consistency))
		}
	case shardpb.Consistency_CONSISTENCY_BOUNDED:
		if bound < MinStalenessBound || bound > MaxStalenessBound {
			return invalid("table %q: staleness bound %s (want %s..%s)", s.Name, bound, MinStalenessBound, MaxStalenessBound)
		}
	default:
		return invalid("table %q: consistency %s", s.Name, s.Consistency)
	}
	switch t := s.HotThreshold; {
	case math.IsNaN(t) || math.IsInf(t, 0) || t < 0:
		return invalid("table %q: hot threshold %v (want pulls a second >= 0; 0 turns hot keys off)", s.Name, t)
	case s.HotReplicas > MaxHotReplicas:
		return invalid("table %q: hot replicas = %d (want 0..%d)", s.Name, s.HotReplicas, MaxHotReplicas)
	case t > 0 && s.HotReplicas == 0:
		s.HotReplicas = DefaultHotReplicas
	case t == 0:
		s.HotReplicas = 0
	}
	return nil
}

// AlterSpec returns spec changed as req asks, validated.
func AlterSpec(spec *shardpb.TableSpec, req *shardpb.AlterTableRequest) (*shardpb.TableSpec, error) {
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
	if err := CheckLevel(s); err != nil {
		return nil, err
	}
	return s, nil
}

// LevelName is a level's name as the CLI spells it.
func LevelName(c shardpb.Consistency) string {
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

// LevelRank orders consistency levels from weakest (1) to strongest (3); 0
// for one that is none of them.
func LevelRank(c shardpb.Consistency) int {
	switch c {
	case shardpb.Consistency_CONSISTENCY_EVENTUAL:
		return 1
	case shardpb.Consistency_CONSISTENCY_BOUNDED:
		return 2
	case shardpb.Consistency_CONSISTENCY_LINEARIZABLE:
		return 3
	}
	return 0
}

// TableConfig is the store config of every shard of the table. Its error
// wraps ErrInvalidConfig and the store's own error.
func TableConfig(s *shardpb.TableSpec) (store.TableConfig, error) {
	in, err := store.ParseInitializer(s.Initializer)
	if err != nil {
		return store.TableConfig{}, fmt.Errorf("%w: table %q: %w", ErrInvalidConfig, s.Name, err)
	}
	opt, err := store.ParseOptimizer(s.Optimizer)
	if err != nil {
		return store.TableConfig{}, fmt.Errorf("%w: table %q: %w", ErrInvalidConfig, s.Name, err)
	}
	cfg := store.TableConfig{Name: s.Name, Dim: int(s.Dim), Init: in, Optimizer: opt, Seed: s.Seed}
	if err := cfg.Validate(); err != nil {
		if !errors.Is(err, ErrInvalidConfig) {
			err = fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
		return store.TableConfig{}, err
	}
	return cfg, nil
}
