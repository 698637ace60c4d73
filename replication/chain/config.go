package chain

import (
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/raftps/raftps/replication"
	"github.com/raftps/raftps/store"
)

// Config configures one replica of one chain-replicated shard. Zero
// fields get the defaults of DefaultConfig.
type Config struct {
	// ID names the group on every node, e.g. "users/3"; the Mux routes
	// by it.
	ID string
	// NodeAddr is this node's gRPC address: its identity in the chain's
	// order. Default: the Mux's LocalAddr.
	NodeAddr string
	// Dir holds the replica's log (chain.db) and snapshots; created if missing.
	Dir string
	// Table is the shard's table config; every replica must have the same.
	Table store.TableConfig
	// Mux carries the chain's messages; one per node.
	Mux *Mux

	// DedupeTTL: see replication.DefaultDedupeTTL.
	DedupeTTL time.Duration
	// Metrics, if set, records the replica's applies and snapshots.
	Metrics *replication.GroupMetrics
	// MaxEntryBytes caps one log entry (a batch of pushes); a single push
	// larger than this is rejected.
	MaxEntryBytes int
	// MaxInflight bounds the entries the head has logged that the tail has
	// not acknowledged; pushes arriving meanwhile wait and go out together.
	MaxInflight int
	// SnapshotEvery is how many entries are applied between snapshots of
	// the table; a snapshot lets the log below it (and below the committed
	// index) be deleted.
	SnapshotEvery uint64
	// RequestTimeout bounds a read sent to the tail.
	RequestTimeout time.Duration
	// RetryInterval is how long a predecessor waits before reconnecting to
	// its successor after the stream broke or was refused.
	RetryInterval time.Duration
	// Space, if set, is asked before each piece of a snapshot from the
	// predecessor is written: a full disk refuses the snapshot (the
	// predecessor tries again later) rather than fill up.
	Space replication.DiskSpace

	Logger hclog.Logger
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{
		DedupeTTL:      replication.DefaultDedupeTTL,
		MaxEntryBytes:  8 << 20,
		MaxInflight:    64,
		SnapshotEvery:  4096,
		RequestTimeout: 5 * time.Second,
		RetryInterval:  50 * time.Millisecond,
	}
}

func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.DedupeTTL == 0 {
		c.DedupeTTL = d.DedupeTTL
	}
	if c.MaxEntryBytes == 0 {
		c.MaxEntryBytes = d.MaxEntryBytes
	}
	if c.MaxInflight == 0 {
		c.MaxInflight = d.MaxInflight
	}
	if c.SnapshotEvery == 0 {
		c.SnapshotEvery = d.SnapshotEvery
	}
	if c.RequestTimeout == 0 {
		c.RequestTimeout = d.RequestTimeout
	}
	if c.RetryInterval == 0 {
		c.RetryInterval = d.RetryInterval
	}
	if c.NodeAddr == "" && c.Mux != nil {
		c.NodeAddr = c.Mux.cfg.LocalAddr
	}
	if c.Logger == nil {
		c.Logger = hclog.NewNullLogger()
	}
	return c
}

func (c Config) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("chain %q: invalid config: %s", c.ID, fmt.Sprintf(format, args...))
	}
	switch {
	case c.ID == "":
		return bad("ID is empty")
	case c.Dir == "":
		return bad("Dir is empty")
	case c.Mux == nil:
		return bad("Mux is nil")
	case c.NodeAddr == "":
		return bad("NodeAddr is empty")
	case c.MaxEntryBytes < 1024 || c.MaxEntryBytes > MaxMessageBytes/2:
		return bad("MaxEntryBytes = %d (want 1024 to %d)", c.MaxEntryBytes, MaxMessageBytes/2)
	case c.MaxInflight < 1:
		return bad("MaxInflight = %d (want at least 1)", c.MaxInflight)
	case c.RequestTimeout < 0 || c.RetryInterval < 0 || c.DedupeTTL < 0:
		return bad("negative duration (RequestTimeout %s, RetryInterval %s, DedupeTTL %s)", c.RequestTimeout, c.RetryInterval, c.DedupeTTL)
	}
	if err := c.Table.Validate(); err != nil {
		return fmt.Errorf("chain %q: %w", c.ID, err)
	}
	return nil
}
