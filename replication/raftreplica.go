package replication

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	"go.etcd.io/bbolt"
)

// RaftConfig configures one replica of any Raft group this package opens:
// a shard group (Group) or another FSM (OpenRaft). Zero durations and sizes
// get the defaults of DefaultRaftConfig.
type RaftConfig struct {
	// ID names the group on every node, e.g. "users/3". It is the transport's
	// group ID.
	ID string
	// NodeID is this node's Raft server ID.
	NodeID raft.ServerID
	// Dir holds this replica's Raft log (raft.db) and snapshots; created if missing.
	Dir string
	// NodeLog, if set, holds the replica's Raft log and stable state instead
	// of a raft.db of its own in Dir: the node's shared log, committed for
	// all its groups at once. A Dir that already has a raft.db (written
	// before the shared log existed) keeps using it.
	NodeLog *NodeLog
	// SegLog gives a new replica (a Dir with no log yet) a SegLog of its own
	// (Dir/wal) instead of a raft.db. A Dir that has either keeps it.
	SegLog bool
	// Transport carries this group's Raft traffic.
	Transport raft.Transport
	// Peers is the initial membership, used only when Dir holds no Raft state
	// yet. Every replica of a new group is given the same list.
	Peers []raft.Server

	// Raft timing. A follower starts an election after a random time in
	// [HeartbeatTimeout, 2×HeartbeatTimeout] without hearing from the leader,
	// so HeartbeatTimeout bounds how long a dead leader blocks writes.
	HeartbeatTimeout   time.Duration
	ElectionTimeout    time.Duration
	LeaderLeaseTimeout time.Duration
	// CommitTimeout is how often an idle leader sends each follower an
	// AppendEntries so it learns the commit index (hashicorp/raft sends one
	// every [CommitTimeout, 2×CommitTimeout] per follower, besides
	// heartbeats). It costs CPU per group whether or not anything is written:
	// at 5 ms a 16-shard table kept a third of a core busy on every node of
	// an idle 3-node cluster (docs/BENCHMARKS.md). Under load entries carry
	// the commit index anyway, so a longer timeout only delays when an idle
	// follower applies the last entries.
	CommitTimeout time.Duration
	// QuietAfter, if positive, quiesces the group once its log has not
	// moved for that long: its replicas switch to QuietHeartbeatTimeout
	// (default 5 s, at least HeartbeatTimeout) for their heartbeat and
	// election timeouts until it moves again (transport_quiet.go). It
	// needs the node to call Tick on every group and ExpediteElection on
	// the followers (failover of a quiet group waits for it, not for
	// raft's slow timer), and a *Transport.
	QuietAfter            time.Duration
	QuietHeartbeatTimeout time.Duration
	// DormantAfter, if positive (and QuietAfter too), makes a group that
	// stayed quiet that much longer dormant: its leader steps down and no
	// replica runs a timer until a request or a peer wakes it
	// (transport_dormant.go). Only for groups whose requests go through
	// Group (Push, ReadIndex, Awaken): a replica opened with OpenRaft
	// alone is never woken by a request.
	DormantAfter time.Duration

	// Snapshots: taken every SnapshotInterval when SnapshotThreshold entries
	// have accumulated; TrailingLogs entries stay after one for slow followers.
	SnapshotThreshold uint64
	SnapshotInterval  time.Duration
	TrailingLogs      uint64

	// NoSync skips fsync of the Raft log. Unsafe: a process that dies
	// loses nothing (its writes are in the page cache), but a machine that
	// crashes can lose acknowledged entries on every replica at once. For
	// tests whose subject is not durability, and benchmarks that want to
	// see what the disk costs (raftps server --unsafe-no-fsync).
	NoSync bool

	// OnNoSpace is called when a write of raft's stable store (its term
	// and vote) fails for lack of space; if it frees some (the node's disk
	// reserve) and says so, the write is tried once more. hashicorp/raft
	// panics when it cannot save its term.
	OnNoSpace func() bool

	Logger hclog.Logger
	// Metrics, if set, records the replica's log appends, applies,
	// snapshots and elections.
	Metrics *GroupMetrics
}

// DefaultRaftConfig returns the defaults, tuned for a LAN: a leader that dies
// is replaced in well under a second.
func DefaultRaftConfig() RaftConfig {
	return RaftConfig{
		HeartbeatTimeout:   200 * time.Millisecond,
		ElectionTimeout:    200 * time.Millisecond,
		LeaderLeaseTimeout: 150 * time.Millisecond,
		CommitTimeout:      50 * time.Millisecond,
		SnapshotThreshold:  4096,
		SnapshotInterval:   30 * time.Second,
		TrailingLogs:       1024,
	}
}

func (c RaftConfig) withDefaults() RaftConfig {
	d := DefaultRaftConfig()
	setDur := func(v *time.Duration, def time.Duration) {
		if *v == 0 {
			*v = def
		}
	}
	setDur(&c.HeartbeatTimeout, d.HeartbeatTimeout)
	setDur(&c.ElectionTimeout, d.ElectionTimeout)
	setDur(&c.LeaderLeaseTimeout, d.LeaderLeaseTimeout)
	setDur(&c.CommitTimeout, d.CommitTimeout)
	setDur(&c.SnapshotInterval, d.SnapshotInterval)
	if c.SnapshotThreshold == 0 {
		c.SnapshotThreshold = d.SnapshotThreshold
	}
	if c.TrailingLogs == 0 {
		c.TrailingLogs = d.TrailingLogs
	}
	if c.Logger == nil {
		c.Logger = hclog.NewNullLogger()
	}
	if c.QuietAfter > 0 && c.QuietHeartbeatTimeout == 0 {
		c.QuietHeartbeatTimeout = max(DefaultQuietHeartbeatTimeout, c.HeartbeatTimeout)
	}
	return c
}

// DefaultQuietHeartbeatTimeout is a quiet group's heartbeat timeout: its
// leader heartbeats each follower every 0.5–1 s.
const DefaultQuietHeartbeatTimeout = 5 * time.Second

func (c RaftConfig) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("group %q: invalid config: %s", c.ID, fmt.Sprintf(format, args...))
	}
	switch {
	case c.ID == "":
		return bad("ID is empty")
	case c.NodeID == "":
		return bad("NodeID is empty")
	case c.Dir == "":
		return bad("Dir is empty")
	case c.Transport == nil:
		return bad("Transport is nil")
	case c.LeaderLeaseTimeout > c.HeartbeatTimeout:
		return bad("LeaderLeaseTimeout (%s) is longer than HeartbeatTimeout (%s)", c.LeaderLeaseTimeout, c.HeartbeatTimeout)
	case c.ElectionTimeout < c.HeartbeatTimeout:
		return bad("ElectionTimeout (%s) is shorter than HeartbeatTimeout (%s)", c.ElectionTimeout, c.HeartbeatTimeout)
	case c.DormantAfter > 0 && c.QuietAfter <= 0:
		return bad("DormantAfter (%s) without QuietAfter", c.DormantAfter)
	case c.QuietAfter > 0 && c.QuietHeartbeatTimeout < c.HeartbeatTimeout:
		return bad("QuietHeartbeatTimeout (%s) is shorter than HeartbeatTimeout (%s)", c.QuietHeartbeatTimeout, c.HeartbeatTimeout)
	}
	return nil
}

// RaftReplica is a running Raft instance with its durable stores.
type RaftReplica struct {
	Raft  *raft.Raft
	cfg   RaftConfig
	logs  replicaLogs
	snaps *raft.FileSnapshotStore

	// expeditedTerm is the last term in which ExpediteElection started an
	// election here.
	expeditedTerm atomic.Uint64
	// lastLeader is the last leader ExpediteElection saw this replica
	// follow, and leaderSeen (Unix nanoseconds) the last time it saw it:
	// raft forgets the leader when another replica's election begins, and
	// an election that fails must not leave the dead leader's group to
	// raft's timer.
	lastLeader atomic.Pointer[seenLeader]
	leaderSeen atomic.Int64
	// quiet switches an idle group's timing (RaftConfig.QuietAfter); nil
	// if it has none.
	quiet *quiescence
	// awakenMu makes concurrent Awaken calls start one election;
	// awakening is set while one runs, so that Dormant stays true until
	// it has a leader.
	awakenMu  sync.Mutex
	awakening atomic.Bool
}

// seenLeader is a leader a replica followed.
type seenLeader struct {
	addr raft.ServerAddress
	id   raft.ServerID
}

// replicaLogs is a replica's log and stable store: a raft-boltdb file of
// its own or its part of the node's shared log.
type replicaLogs interface {
	raft.LogStore
	raft.StableStore
	Close() error
}

// logCacheEntries is how many recent log entries each replica keeps in memory
// for replication to followers. Shard entries are at most MaxEntryBytes, so the
// cache costs at most logCacheEntries × MaxEntryBytes per group, and typically
// a few MiB.
const logCacheEntries = 16

// OpenRaft starts a replica of a Raft group with fsm. If cfg.Dir holds Raft
// state the replica resumes from it (restoring the latest snapshot and
// replaying the log); otherwise, if cfg.Peers is set, it bootstraps the group.
func OpenRaft(cfg RaftConfig, fsm raft.FSM) (*RaftReplica, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("group %s: %w", cfg.ID, err)
	}
	logs, dbPath, err := openReplicaLogs(cfg)
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*RaftReplica, error) {
		logs.Close()
		return nil, fmt.Errorf("group %s: %w", cfg.ID, err)
	}
	snaps, err := raft.NewFileSnapshotStoreWithLogger(cfg.Dir, 2, cfg.Logger.Named("snapshots"))
	if err != nil {
		return fail(fmt.Errorf("opening snapshot store: %w", err))
	}
	rc := raft.DefaultConfig()
	rc.LocalID = cfg.NodeID
	rc.HeartbeatTimeout = cfg.HeartbeatTimeout
	rc.ElectionTimeout = cfg.ElectionTimeout
	rc.LeaderLeaseTimeout = cfg.LeaderLeaseTimeout
	rc.CommitTimeout = cfg.CommitTimeout
	rc.SnapshotThreshold = cfg.SnapshotThreshold
	rc.SnapshotInterval = cfg.SnapshotInterval
	rc.TrailingLogs = cfg.TrailingLogs
	// Not BatchApplyCh: with it, Apply queues into a buffered channel, and a
	// future still queued when raft shuts down is never answered (Close would
	// wait for ever). The leader loop group-commits whatever is waiting on the
	// unbuffered channel anyway, and the batcher coalesces pushes before that.
	rc.BatchApplyCh = false
	// A full AppendEntries of maximum-size shard entries must fit in one
	// transport message (MaxRaftMessageBytes).
	rc.MaxAppendEntries = MaxAppendEntries
	rc.Logger = cfg.Logger.Named("raft")
	if t, ok := cfg.Transport.(*Transport); ok && cfg.DormantAfter > 0 {
		rc.Logger = dormantLogger{Logger: rc.Logger, t: t}
	}
	if err := raft.ValidateConfig(rc); err != nil {
		return fail(err)
	}
	if t, ok := cfg.Transport.(*Transport); ok {
		t.setHeartbeatTimeout(cfg.HeartbeatTimeout)
	}
	checked := checkedLogs{LogStore: logs, what: dbPath, log: cfg.Logger}
	stable := spaceStable{StableStore: logs, onNoSpace: cfg.OnNoSpace}
	// Everything below reads the replica's state (the stable store, the
	// newest snapshot that restores, every entry after it): a failure or a
	// panic there is a corrupt replica, unless the disk is full.
	var existing bool
	var r *raft.Raft
	err = Contain("raft state in "+cfg.Dir, func() (err error) {
		if existing, err = raft.HasExistingState(checked, stable, snaps); err != nil {
			return fmt.Errorf("reading raft state: %w", err)
		}
		// The leader replicates entries it has just written: serve them
		// from memory rather than reading and decoding them back from bolt.
		var appends raft.LogStore = checked
		if cfg.Metrics != nil {
			appends = timedLogs{LogStore: checked, g: cfg.Metrics}
		}
		cached, err := raft.NewLogCache(logCacheEntries, appends)
		if err != nil {
			return err
		}
		if r, err = raft.NewRaft(rc, fsm, cached, stable, snaps, cfg.Transport); err != nil {
			return fmt.Errorf("starting raft: %w", err)
		}
		return nil
	})
	if err != nil {
		if !errors.Is(err, ErrCorruptReplica) && !IsNoSpace(err) {
			err = fmt.Errorf("%w: %w", ErrCorruptReplica, err)
		}
		return fail(err)
	}
	rep := &RaftReplica{Raft: r, cfg: cfg, logs: logs, snaps: snaps}
	if t, ok := cfg.Transport.(*Transport); ok {
		t.raft.Store(r) // for the term checks of reads
		if cfg.QuietAfter > 0 {
			rep.quiet = &quiescence{raft: r, transport: t, after: cfg.QuietAfter, dormantAfter: cfg.DormantAfter,
				fast: cfg.HeartbeatTimeout, slow: cfg.QuietHeartbeatTimeout, election: cfg.ElectionTimeout, logger: cfg.Logger}
			t.quiet.Store(rep.quiet)
		}
	}
	if !existing && len(cfg.Peers) > 0 {
		err := r.BootstrapCluster(raft.Configuration{Servers: cfg.Peers}).Error()
		if err != nil && !errors.Is(err, raft.ErrCantBootstrap) {
			r.Shutdown()
			return fail(fmt.Errorf("bootstrap: %w", err))
		}
		if err == nil {
			rep.campaignFirst()
		}
	}
	return rep, nil
}

// openReplicaLogs opens the replica's log and stable store: its part of
// the node's shared log, unless it has a raft.db of its own (or there is
// no shared log). It returns what to call the log in messages.
func openReplicaLogs(cfg RaftConfig) (replicaLogs, string, error) {
	dbPath := filepath.Join(cfg.Dir, "raft.db")
	_, statErr := os.Stat(dbPath)
	if HasSegLog(cfg.Dir) || (cfg.SegLog && cfg.NodeLog == nil && errors.Is(statErr, os.ErrNotExist) && !HasNodeLog(cfg.Dir)) {
		var sl *SegLog
		err := Contain("raft log "+filepath.Join(cfg.Dir, SegLogDir), func() (err error) {
			sl, err = OpenSegLog(cfg.Dir, cfg.NoSync)
			return err
		})
		if err != nil {
			return nil, "", fmt.Errorf("group %s: raft log: %w", cfg.ID, err)
		}
		return sl, sl.dir, nil
	}
	if cfg.NodeLog != nil && errors.Is(statErr, os.ErrNotExist) {
		var gl *groupLog
		err := Contain("raft log in the shared log", func() (err error) {
			gl, err = cfg.NodeLog.openGroup(cfg.Dir)
			return err
		})
		if err != nil {
			return nil, "", fmt.Errorf("group %s: raft log: %w", cfg.ID, err)
		}
		return gl, fmt.Sprintf("%s (ID %d)", cfg.NodeLog.Path(), gl.id), nil
	}
	if HasNodeLog(cfg.Dir) {
		// Its log and vote are lost with the shared file: rebuilt from its
		// peers, never opened empty.
		return nil, "", fmt.Errorf("group %s: %w: its raft log was in the node's shared log, and the node has none", cfg.ID, ErrCorruptReplica)
	}
	if err := CheckBoltFile(dbPath); err != nil {
		return nil, "", fmt.Errorf("group %s: raft log: %w", cfg.ID, err)
	}
	var logs *raftboltdb.BoltStore
	err := Contain("raft log "+dbPath, func() (err error) {
		logs, err = raftboltdb.New(raftboltdb.Options{
			Path:   dbPath,
			NoSync: cfg.NoSync,
			BoltOptions: &bbolt.Options{
				// Another process holding the file (a second server on the
				// same data dir) is an error to report, not a lock to wait on.
				Timeout: 2 * time.Second,
				// The freelist is rebuilt by a scan on open instead of being
				// written on every commit: a Raft log is small (snapshots
				// truncate it) and commits are many.
				NoFreelistSync: true,
				FreelistType:   bbolt.FreelistMapType,
			},
		})
		return err
	})
	if err != nil {
		return nil, "", fmt.Errorf("group %s: opening raft log %s: %w", cfg.ID, dbPath, BoltOpenError(err))
	}
	return logs, dbPath, nil
}

// FirstLogIndex returns the first index in the log (it grows as snapshots
// compact the log).
func (r *RaftReplica) FirstLogIndex() (uint64, error) { return r.logs.FirstIndex() }

// closeTransport closes the replica's transport, if it is ours, before raft
// shuts down: raft's Shutdown waits for its replicators, and their calls to a
// peer that does not answer (or waits for its connection, awaitReady) end
// only with the transport.
func (r *RaftReplica) closeTransport() {
	if t, ok := r.cfg.Transport.(*Transport); ok {
		t.Close()
	}
}

// Close shuts Raft down and closes the log.
func (r *RaftReplica) Close() error {
	if r.quiet != nil {
		r.quiet.close()
	}
	r.closeTransport()
	err := r.Raft.Shutdown().Error()
	if cerr := r.logs.Close(); err == nil {
		err = cerr
	}
	return err
}
