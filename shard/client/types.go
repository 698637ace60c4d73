package client

import (
	"fmt"
	"strings"
	"time"

	"github.com/raftps/raftps/shard/api"
	"github.com/raftps/raftps/shard/shardpb"
)

// Level is a consistency level of a table or of one read.
type Level uint8

// The levels, weakest last. The zero Level is unset: in a TableSpec the
// server's default (Linearizable), in a read the table's own level.
const (
	Linearizable Level = iota + 1
	Bounded
	Eventual
)

// ParseLevel parses "linearizable", "bounded" or "eventual".
func ParseLevel(s string) (Level, error) {
	switch s {
	case "linearizable":
		return Linearizable, nil
	case "bounded":
		return Bounded, nil
	case "eventual":
		return Eventual, nil
	}
	return 0, fmt.Errorf("consistency level %q: want linearizable, bounded or eventual", s)
}

func (l Level) String() string {
	switch l {
	case 0:
		return "default"
	case Linearizable:
		return "linearizable"
	case Bounded:
		return "bounded"
	case Eventual:
		return "eventual"
	}
	return fmt.Sprintf("Level(%d)", uint8(l))
}

func (l Level) proto() shardpb.Consistency {
	switch l {
	case Linearizable:
		return shardpb.Consistency_CONSISTENCY_LINEARIZABLE
	case Bounded:
		return shardpb.Consistency_CONSISTENCY_BOUNDED
	case Eventual:
		return shardpb.Consistency_CONSISTENCY_EVENTUAL
	}
	return shardpb.Consistency_CONSISTENCY_UNSPECIFIED
}

func levelOf(c shardpb.Consistency) Level {
	switch c {
	case shardpb.Consistency_CONSISTENCY_LINEARIZABLE:
		return Linearizable
	case shardpb.Consistency_CONSISTENCY_BOUNDED:
		return Bounded
	case shardpb.Consistency_CONSISTENCY_EVENTUAL:
		return Eventual
	}
	return 0
}

// Consistency is a table's level with its staleness bound (Bounded only):
// "linearizable", "bounded:100ms", "eventual".
type Consistency struct {
	Level Level
	Bound time.Duration
}

// ParseConsistency parses "linearizable", "bounded:DURATION" or "eventual".
func ParseConsistency(s string) (Consistency, error) {
	name, bound, hasBound := strings.Cut(s, ":")
	l, err := ParseLevel(name)
	if err != nil {
		return Consistency{}, fmt.Errorf("consistency %q: want linearizable, bounded:DURATION (e.g. bounded:100ms) or eventual", s)
	}
	if l != Bounded {
		if hasBound {
			return Consistency{}, fmt.Errorf("consistency %q: only bounded takes a duration", s)
		}
		return Consistency{Level: l}, nil
	}
	if !hasBound {
		return Consistency{}, fmt.Errorf("consistency %q: bounded needs its bound, e.g. bounded:100ms", s)
	}
	d, err := time.ParseDuration(bound)
	if err != nil || d <= 0 {
		return Consistency{}, fmt.Errorf("consistency %q: the bound %q is not a positive duration", s, bound)
	}
	return Consistency{Level: Bounded, Bound: d}, nil
}

func (c Consistency) String() string {
	if c.Level == Bounded {
		return fmt.Sprintf("bounded:%s", c.Bound)
	}
	return c.Level.String()
}

// MarshalText writes the consistency as ParseConsistency reads it.
func (c Consistency) MarshalText() ([]byte, error) { return []byte(c.String()), nil }

// UnmarshalText reads what MarshalText writes.
func (c *Consistency) UnmarshalText(b []byte) error {
	v, err := ParseConsistency(string(b))
	if err != nil {
		return err
	}
	*c = v
	return nil
}

// Replication is how a table's shards are replicated.
type Replication string

// The replication modes: every shard a Raft group (the default), or a chain
// (head → ... → tail) ordered by the metadata group.
const (
	Raft  Replication = api.ReplicationRaft
	Chain Replication = api.ReplicationChain
)

// TableSpec describes a table. Zero fields take the server's defaults, and
// the spec a node stores (CreateTable's answer) has them filled in.
type TableSpec struct {
	Name string `json:"name"`
	Dim  int    `json:"dim"`
	// Initializer: "zeros" (the default), "uniform:A" or "normal:SIGMA",
	// seeded by Seed and the key, so every replica computes the same first
	// value.
	Initializer string `json:"initializer"`
	// Optimizer: "sgd" (the default), "adagrad", "adam" or "ftrl",
	// optionally with ":name=value,...", e.g. "adagrad:lr=0.05".
	Optimizer   string      `json:"optimizer"`
	Seed        uint64      `json:"seed"`
	Shards      int         `json:"shards"`
	Replicas    int         `json:"replicas"`
	Replication Replication `json:"replication"`
	Consistency Consistency `json:"consistency"`
	// HotThreshold: a key pulled at least this many times a second (over all
	// replicas of its shard) is hot and gets HotReplicas read replicas; 0
	// turns hot keys off.
	HotThreshold float64 `json:"hot_threshold,omitempty"`
	HotReplicas  int     `json:"hot_replicas,omitempty"`
	// GradPrecision: what pushes' gradients travel and are logged as,
	// GradFP32 (the default) or GradBF16 (bfloat16: half the bytes, each
	// gradient rounded to 8 bits of mantissa once, by the client, before
	// it is replicated; rows stay float32). Fixed at creation.
	GradPrecision GradPrecision `json:"grad_precision,omitempty"`
}

// GradPrecision is a table's gradient precision (TableSpec.GradPrecision).
type GradPrecision string

// The gradient precisions; "" is GradFP32.
const (
	GradFP32 GradPrecision = api.GradFP32
	GradBF16 GradPrecision = api.GradBF16
)

func (s TableSpec) proto() *shardpb.TableSpec {
	return &shardpb.TableSpec{
		Name: s.Name, Dim: uint32(s.Dim), Initializer: s.Initializer, Optimizer: s.Optimizer, Seed: s.Seed,
		Shards: uint32(s.Shards), Replicas: uint32(s.Replicas), Replication: string(s.Replication),
		Consistency: s.Consistency.Level.proto(), StalenessBoundNs: int64(s.Consistency.Bound),
		HotThreshold: s.HotThreshold, HotReplicas: uint32(s.HotReplicas), GradPrecision: string(s.GradPrecision),
	}
}

// check refuses what the wire's narrower fields cannot carry.
func (s TableSpec) check() error {
	const max32 = 1<<32 - 1
	switch {
	case s.Dim < 0 || s.Dim > max32:
		return fmt.Errorf("%w: table %q: dim %d", ErrInvalidConfig, s.Name, s.Dim)
	case s.Shards < 0 || s.Shards > max32:
		return fmt.Errorf("%w: table %q: shards %d", ErrInvalidConfig, s.Name, s.Shards)
	case s.Replicas < 0 || s.Replicas > max32:
		return fmt.Errorf("%w: table %q: replicas %d", ErrInvalidConfig, s.Name, s.Replicas)
	case s.HotReplicas < 0 || s.HotReplicas > max32:
		return fmt.Errorf("%w: table %q: hot replicas %d", ErrInvalidConfig, s.Name, s.HotReplicas)
	}
	return nil
}

func specOf(p *shardpb.TableSpec) TableSpec {
	return TableSpec{
		Name: p.GetName(), Dim: int(p.GetDim()), Initializer: p.GetInitializer(), Optimizer: p.GetOptimizer(), Seed: p.GetSeed(),
		Shards: int(p.GetShards()), Replicas: int(p.GetReplicas()), Replication: Replication(p.GetReplication()),
		Consistency:  Consistency{Level: levelOf(p.GetConsistency()), Bound: time.Duration(p.GetStalenessBoundNs())},
		HotThreshold: p.GetHotThreshold(), HotReplicas: int(p.GetHotReplicas()),
		GradPrecision: GradPrecision(p.GetGradPrecision()),
	}
}

// ShardInfo is one shard's placement and leader as a node knows them.
type ShardInfo struct {
	Shard int `json:"shard"`
	// Replicas are node IDs, the preferred leader first (a chain's head
	// first); Adding a node catching up to join them, or "".
	Replicas []string `json:"replicas"`
	Adding   string   `json:"adding,omitempty"`
	// Epoch grows with every change of the shard's placement.
	Epoch uint64 `json:"epoch"`
	// The shard's leader (a chain's head) as the answering node knows it;
	// empty if none is known.
	LeaderID   string `json:"leader_id,omitempty"`
	LeaderAddr string `json:"leader_addr,omitempty"`
}

// TableInfo is what Describe returns: the spec, every shard's placement and
// leader, and the client addresses of the nodes they name, by node ID.
type TableInfo struct {
	Spec   TableSpec         `json:"spec"`
	Shards []ShardInfo       `json:"shards"`
	Nodes  map[string]string `json:"nodes"`
}

func tableInfoOf(d *shardpb.DescribeTableResponse) TableInfo {
	info := TableInfo{Spec: specOf(d.GetSpec()), Nodes: map[string]string{}}
	for _, nd := range d.GetNodes() {
		info.Nodes[nd.Id] = nd.Addr
	}
	for i, sm := range d.GetShards() {
		si := ShardInfo{Shard: i, Replicas: sm.GetReplicas(), Adding: sm.GetAdding(), Epoch: sm.GetEpoch()}
		for _, l := range d.GetLeaders() {
			if int(l.Shard) == i {
				si.LeaderID, si.LeaderAddr = l.LeaderId, l.LeaderAddr
			}
		}
		info.Shards = append(info.Shards, si)
	}
	return info
}
