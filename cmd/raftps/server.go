package main

import (
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/raftps/raftps/replication"
	"github.com/raftps/raftps/shard"
	"github.com/raftps/raftps/shard/diskguard"
	"github.com/raftps/raftps/test/localcluster"
)

func runServer(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("raftps server", flag.ContinueOnError)
	var (
		cfg         shard.NodeConfig
		peers       string
		clusterJoin string
		gossipJoin  string
		logLevel    string
		stopWith    int
		// the streams limits are uint32s in the config
		maxStreams, peerMaxStreams int
		tlsFlags                   serverTLSFlags
	)
	d := replication.DefaultRaftConfig()
	fs.StringVar(&cfg.ID, "id", "", "this node's ID, unique in the cluster (required)")
	fs.StringVar(&cfg.Addr, "addr", "", "client API address to listen on and advertise to clients, e.g. 127.0.0.1:7001 (required)")
	fs.StringVar(&cfg.PeerAddr, "peer-addr", "", fmt.Sprintf("peer API address (Raft, chains, node-to-node calls) to listen on and advertise to the other nodes (default: the --addr host, port + %d)", shard.PeerPortOffset))
	fs.StringVar(&cfg.HTTPAddr, "http", "", "HTTP address for the dashboard (/), /metrics, /healthz and (with --pprof) /debug/pprof; with no host (:7101) it binds 127.0.0.1 (empty: none)")
	fs.BoolVar(&cfg.Pprof, "pprof", false, "serve /debug/pprof on the HTTP port (profile and trace at most 60 seconds)")
	fs.BoolVar(&cfg.NoMetrics, "no-metrics", false, "record no metrics and serve no /metrics (to measure what they cost)")
	tlsFlags.register(fs)
	fs.StringVar(&cfg.DataDir, "data-dir", "", "directory for this node's Raft logs and snapshots (required)")
	fs.StringVar(&peers, "peers", "", "a static cluster: its first nodes as ID=PEER_ADDR,... (peer addresses) including this one, all voting in the metadata group. On a node's first start give one of --peers, --bootstrap and --join; a restarted node (its --data-dir holds cluster state) needs none")
	fs.BoolVar(&cfg.Bootstrap, "bootstrap", false, "start a new cluster with this node alone; add nodes with --join")
	fs.StringVar(&clusterJoin, "join", "", "peer addresses of running nodes to join, comma-separated (any one that answers will do)")
	fs.DurationVar(&cfg.RepairGrace, "repair-grace", shard.DefaultRepairGrace, "how long a node must stay dead before its replicas are placed on other nodes")
	fs.IntVar(&cfg.MaxMoves, "max-moves", shard.DefaultMaxMoves, "how many shards may be gaining a replica at once (bounds repair and rebalancing traffic)")
	fs.StringVar(&cfg.Gossip.Addr, "gossip-addr", "", fmt.Sprintf("memberlist gossip address (UDP and TCP) to bind and advertise (default: the --addr host, port + %d)", shard.GossipPortOffset))
	fs.StringVar(&gossipJoin, "gossip-join", "", fmt.Sprintf("gossip addresses of other nodes to join, comma-separated (default: each --peers or --join peer address with port %+d)", shard.GossipPortOffset-shard.PeerPortOffset))
	fs.DurationVar(&cfg.Gossip.ProbeInterval, "gossip-probe-interval", 0, "how often memberlist probes a random node (0: memberlist's LAN default, 1s)")
	fs.DurationVar(&cfg.Gossip.ProbeTimeout, "gossip-probe-timeout", 0, "how long memberlist waits for a probe's answer (0: memberlist's LAN default, 500ms)")
	fs.DurationVar(&cfg.Gossip.GossipInterval, "gossip-interval", 0, "how often memberlist gossips (0: memberlist's LAN default, 200ms)")
	fs.IntVar(&cfg.Gossip.SuspicionMult, "gossip-suspicion-mult", 0, "memberlist's suspicion multiplier: how many probe intervals a suspect node has to refute it (0: memberlist's LAN default, 4)")
	fs.DurationVar(&cfg.Gossip.RejoinInterval, "gossip-rejoin-interval", 0, "how often to join again the nodes gossip does not see alive (0: 5s)")
	fs.DurationVar(&cfg.Raft.HeartbeatTimeout, "heartbeat-timeout", d.HeartbeatTimeout, "Raft heartbeat timeout of the metadata group, and how long a shard leader's node may be silent before its followers elect another (see --expedite-election)")
	fs.DurationVar(&cfg.GroupHeartbeatTimeout, "group-heartbeat-timeout", 0, "Raft heartbeat and election timeout of shard groups (0: 1.5 × --expedite-election, 300ms at the defaults, so raft's own timer never races an expedited election; negative: --heartbeat-timeout): their leaders heartbeat each follower every tenth of it, so a longer one (1s) makes idle groups cheaper; failover of a dead node's shards does not wait for it (node pings and --expedite-election drive it), only a leader that lives but stops leading one group does")
	fs.DurationVar(&cfg.QuiesceAfter, "quiesce-after", shard.DefaultQuiesceAfter, "a Raft group (a shard's or the metadata group) whose log has not moved for this long switches to --quiet-heartbeat-timeout until the next write, so idle tables cost next to nothing; failover of its leader's node still takes --expedite-election (negative: never; off with --expedite-election or --ping-interval negative)")
	fs.DurationVar(&cfg.DormantAfter, "dormant-after", shard.DefaultDormantAfter, "a shard group quiet for this much longer goes dormant: its leader steps down and no replica runs a timer until a write, a linearizable or bounded read or a membership change wakes it with an election (negative: never; off when --quiesce-after is)")
	fs.DurationVar(&cfg.QuietHeartbeatTimeout, "quiet-heartbeat-timeout", replication.DefaultQuietHeartbeatTimeout, "Raft heartbeat and election timeout of a quiet group: its leader heartbeats each follower every tenth to fifth of it")
	fs.DurationVar(&cfg.PingInterval, "ping-interval", replication.DefaultPingInterval, "how often a node pings each peer it has not heard from meanwhile, so a dead node is noticed within a few intervals however idle its groups (negative: never, and --idle-append-refresh is off)")
	fs.DurationVar(&cfg.IdleAppendRefresh, "idle-append-refresh", replication.DefaultIdleAppendRefresh, "a shard leader answers an idle append (no entries, nothing new) from the follower's last answer to the same one for up to this long instead of sending it (negative: always send)")
	fs.DurationVar(&cfg.Raft.ElectionTimeout, "election-timeout", d.ElectionTimeout, "Raft election timeout")
	fs.BoolVar(&cfg.FaultInjection, "fault-injection", false, "serve /debug/netfault on the HTTP port, through which tests cut this node off from chosen peers (raftps chaos partitions of a local cluster); only in test builds (-tags raftps_faultinject), refused by others")
	fs.DurationVar(&cfg.ExpediteElection, "expedite-election", 0, "start a shard election at once when the leader's node has been silent this long (0: the heartbeat timeout; negative: leave it to Raft's randomised timer)")
	fs.DurationVar(&cfg.ChainSilence, "chain-silence", 0, "remove a node from every chain once the metadata leader has not heard from it this long (0: twice the heartbeat timeout, at least 500ms; negative: only when gossip declares it dead)")
	fs.DurationVar(&cfg.Raft.LeaderLeaseTimeout, "leader-lease-timeout", d.LeaderLeaseTimeout, "Raft leader lease timeout (at most the heartbeat timeout)")
	fs.DurationVar(&cfg.Raft.CommitTimeout, "commit-timeout", d.CommitTimeout, "how often an idle Raft leader tells followers the commit index (each costs CPU per group)")
	fs.Uint64Var(&cfg.Raft.SnapshotThreshold, "snapshot-threshold", d.SnapshotThreshold, "log entries between snapshots")
	fs.Uint64Var(&cfg.Raft.TrailingLogs, "trailing-logs", d.TrailingLogs, "log entries kept after a snapshot")
	fs.BoolVar(&cfg.Raft.NoSync, "unsafe-no-fsync", false, "do not fsync the Raft logs: an update acknowledged shortly before the machine (not only the process) crashes can be lost on every replica; for tests and benchmarks, never on a production node")
	fs.BoolFunc("seg-log", "put new shard replicas' Raft logs in segment files of their own (one write and one fdatasync per append; default true) instead of a raft-boltdb file each (false); replicas keep the kind they were created with", func(s string) (err error) {
		cfg.BoltLogs, err = strconv.ParseBool(s)
		cfg.BoltLogs = !cfg.BoltLogs
		return err
	})
	fs.BoolVar(&cfg.SharedLog, "shared-log", false, "put new shard replicas' Raft logs in the node's shared log (one bbolt file, one commit and fsync for all groups' appends) instead of a file each; replicas keep the kind they were created with")
	fs.IntVar(&stopWith, "stop-with-pid", 0, "shut down, as on SIGTERM, once process PID has exited: the test or supervisor that started this node, so that it does not outlive them (0: never)")
	fs.IntVar(&cfg.MaxMessageBytes, "max-message-bytes", shard.DefaultMaxMessageBytes, "largest client API message received (the peer listener's limit is Raft's largest message)")
	fs.IntVar(&cfg.MaxAnswerBytes, "max-answer-bytes", shard.DefaultMaxAnswerBytes, "most row bytes (keys × dim × 4) one pull, or all parts of one pull batch, may ask for")
	fs.IntVar(&cfg.MaxBatchParts, "max-batch-parts", shard.DefaultMaxBatchParts, "most parts in one pull or push batch (a client's batch holds up to 2 per shard)")
	fs.IntVar(&cfg.BatchWorkers, "batch-workers", shard.DefaultBatchWorkers, "how many parts of one batch are served at once")
	fs.IntVar(&maxStreams, "max-streams", shard.DefaultMaxStreams, "concurrent calls per client connection (HTTP/2 MaxConcurrentStreams)")
	fs.IntVar(&peerMaxStreams, "peer-max-streams", shard.DefaultPeerMaxStreams, "concurrent calls and streams per peer connection (above the Raft pipelines and chain streams a peer keeps open)")
	fs.DurationVar(&cfg.ChecksumInterval, "checksum-interval", shard.DefaultChecksumInterval, "status --checksums reads this node's replicas at most once per interval; callers in between get the last pass's checksums")
	fs.IntVar(&cfg.MaxTables, "max-tables", shard.DefaultMaxTables, "most tables the cluster may hold (checked by the metadata leader when a table is created)")
	fs.IntVar(&cfg.MaxReplicasPerNode, "max-replicas-per-node", shard.DefaultMaxReplicasPerNode, "most shard replicas a table creation may leave on any one node")
	fs.IntVar(&cfg.MaxJobs, "max-jobs", shard.DefaultMaxJobs, "most trainer jobs the registry may hold")
	fs.StringVar(&logLevel, "log-level", "info", "trace, debug, info, warn or error")
	diskMinFree := fs.Uint64("disk-min-free-mib", diskguard.DefaultMinFree>>20, "refuse pushes (ResourceExhausted, \"disk full on ID\") while the data dir's file system has less than this many MiB free; they resume by themselves at a quarter more")
	diskReserve := fs.Uint64("disk-reserve-mib", diskguard.DefaultReserve>>20, "MiB of the reserve file kept in the data dir, deleted to give Raft room when the disk fills regardless (0: none)")
	if rc := parse(fs, args, stderr); rc >= 0 {
		return rc
	}
	cfg.DiskMinFree, cfg.DiskReserve = *diskMinFree<<20, *diskReserve<<20
	switch {
	case cfg.ID == "":
		return fail(stderr, "server", fmt.Errorf("--id is required"))
	case maxStreams < 1 || maxStreams > math.MaxUint32:
		return fail(stderr, "server", fmt.Errorf("--max-streams %d: want 1 to %d", maxStreams, uint32(math.MaxUint32)))
	case peerMaxStreams < 1 || peerMaxStreams > math.MaxUint32:
		return fail(stderr, "server", fmt.Errorf("--peer-max-streams %d: want 1 to %d", peerMaxStreams, uint32(math.MaxUint32)))
	case cfg.Addr == "":
		return fail(stderr, "server", fmt.Errorf("--addr is required"))
	case cfg.DataDir == "":
		return fail(stderr, "server", fmt.Errorf("--data-dir is required"))
	case cfg.FaultInjection && !shard.FaultInjectionBuilt:
		return fail(stderr, "server", fmt.Errorf("--fault-injection: this is a production build, which has no /debug/netfault; tests and chaos of a local cluster build raftps with -tags raftps_faultinject (make build-faults)"))
	}
	var err error
	if cfg.Peers, err = shard.ParsePeers(peers); err != nil {
		return fail(stderr, "server", fmt.Errorf("--peers: %w", err))
	}
	cfg.Join, cfg.Gossip.Join = splitList(clusterJoin), splitList(gossipJoin)
	if ways := len(slices.DeleteFunc([]bool{len(cfg.Peers) > 0, cfg.Bootstrap, len(cfg.Join) > 0}, func(b bool) bool { return !b })); ways > 1 {
		return fail(stderr, "server", fmt.Errorf("give one of --peers, --bootstrap and --join"))
	}
	var parentGone <-chan struct{}
	if stopWith != 0 {
		if stopWith < 0 {
			return fail(stderr, "server", fmt.Errorf("--stop-with-pid %d: not a process ID", stopWith))
		}
		if parentGone, err = localcluster.Exited(stopWith); err != nil {
			return fail(stderr, "server", fmt.Errorf("--stop-with-pid: %w", err))
		}
	}
	cfg.MaxStreams, cfg.PeerMaxStreams = uint32(maxStreams), uint32(peerMaxStreams)
	cfg.Logger = hclog.New(&hclog.LoggerOptions{Name: "raftps", Level: hclog.LevelFromString(logLevel), Output: stderr})
	if cfg.Raft.NoSync {
		cfg.Logger.Warn("--unsafe-no-fsync: the Raft logs are not fsynced; a machine crash can lose acknowledged updates")
	}
	if err := tlsFlags.apply(&cfg, cfg.Logger); err != nil {
		return fail(stderr, "server", err)
	}
	node, err := shard.StartNode(cfg)
	if err != nil {
		return fail(stderr, "server", err)
	}
	fmt.Fprintf(stdout, "raftps server %s serving clients on %s, peers on %s\n", cfg.ID, cfg.Addr, node.PeerAddr())
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	select {
	case s := <-sig:
		cfg.Logger.Info("shutting down", "signal", s.String())
	case <-parentGone:
		cfg.Logger.Info("shutting down: the process of --stop-with-pid exited", "pid", stopWith)
	case <-node.Failed():
		node.Close()
		return fail(stderr, "server", node.Err())
	}
	done := make(chan error, 1)
	go func() { done <- node.Close() }()
	select {
	case err := <-done:
		if err != nil {
			return fail(stderr, "server", err)
		}
	case <-time.After(10 * time.Second):
		return fail(stderr, "server", fmt.Errorf("shutdown took longer than 10s"))
	}
	return 0
}
