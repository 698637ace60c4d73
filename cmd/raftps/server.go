package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/raftps/raftps/replication"
	"github.com/raftps/raftps/shard"
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
	)
	d := replication.DefaultRaftConfig()
	fs.StringVar(&cfg.ID, "id", "", "this node's ID, unique in the cluster (required)")
	fs.StringVar(&cfg.Addr, "addr", "", "client API address to listen on and advertise to clients, e.g. 127.0.0.1:7001 (required)")
	fs.StringVar(&cfg.PeerAddr, "peer-addr", "", fmt.Sprintf("peer API address (Raft, chains, node-to-node calls) to listen on and advertise to the other nodes (default: the --addr host, port + %d)", shard.PeerPortOffset))
	fs.StringVar(&cfg.HTTPAddr, "http", "", "HTTP address for /healthz and /debug/pprof (empty: none)")
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
	fs.DurationVar(&cfg.Raft.HeartbeatTimeout, "heartbeat-timeout", d.HeartbeatTimeout, "Raft heartbeat timeout: how long followers wait for a dead leader")
	fs.DurationVar(&cfg.Raft.ElectionTimeout, "election-timeout", d.ElectionTimeout, "Raft election timeout")
	fs.BoolVar(&cfg.FaultInjection, "fault-injection", false, "serve /debug/netfault on the HTTP port, through which tests cut this node off from chosen peers (raftps chaos partitions of a local cluster); never on a production node")
	fs.DurationVar(&cfg.ExpediteElection, "expedite-election", 0, "start a shard election at once when the leader's node has been silent this long (0: the heartbeat timeout; negative: leave it to Raft's randomised timer)")
	fs.DurationVar(&cfg.ChainSilence, "chain-silence", 0, "remove a node from every chain once the metadata leader has not heard from it this long (0: twice the heartbeat timeout, at least 500ms; negative: only when gossip declares it dead)")
	fs.DurationVar(&cfg.Raft.LeaderLeaseTimeout, "leader-lease-timeout", d.LeaderLeaseTimeout, "Raft leader lease timeout (at most the heartbeat timeout)")
	fs.DurationVar(&cfg.Raft.CommitTimeout, "commit-timeout", d.CommitTimeout, "how often an idle Raft leader tells followers the commit index (each costs CPU per group)")
	fs.Uint64Var(&cfg.Raft.SnapshotThreshold, "snapshot-threshold", d.SnapshotThreshold, "log entries between snapshots")
	fs.Uint64Var(&cfg.Raft.TrailingLogs, "trailing-logs", d.TrailingLogs, "log entries kept after a snapshot")
	fs.BoolVar(&cfg.Raft.NoSync, "unsafe-no-fsync", false, "do not fsync the Raft logs: an update acknowledged shortly before the machine (not only the process) crashes can be lost on every replica; for tests and benchmarks, never on a production node")
	fs.IntVar(&stopWith, "stop-with-pid", 0, "shut down, as on SIGTERM, once process PID has exited: the test or supervisor that started this node, so that it does not outlive them (0: never)")
	fs.IntVar(&cfg.MaxMessageBytes, "max-message-bytes", shard.DefaultMaxMessageBytes, "largest client API message accepted")
	fs.StringVar(&logLevel, "log-level", "info", "trace, debug, info, warn or error")
	if rc := parse(fs, args, stderr); rc >= 0 {
		return rc
	}
	switch {
	case cfg.ID == "":
		return fail(stderr, "server", fmt.Errorf("--id is required"))
	case cfg.Addr == "":
		return fail(stderr, "server", fmt.Errorf("--addr is required"))
	case cfg.DataDir == "":
		return fail(stderr, "server", fmt.Errorf("--data-dir is required"))
	}
	for _, p := range strings.Split(peers, ",") {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		id, addr, ok := strings.Cut(p, "=")
		if !ok {
			return fail(stderr, "server", fmt.Errorf("--peers: %q is not ID=PEER_ADDR", p))
		}
		cfg.Peers = append(cfg.Peers, shard.Peer{ID: id, PeerAddr: addr})
	}
	for _, a := range strings.Split(clusterJoin, ",") {
		if a = strings.TrimSpace(a); a != "" {
			cfg.Join = append(cfg.Join, a)
		}
	}
	for _, a := range strings.Split(gossipJoin, ",") {
		if a = strings.TrimSpace(a); a != "" {
			cfg.Gossip.Join = append(cfg.Gossip.Join, a)
		}
	}
	if ways := btoi(len(cfg.Peers) > 0) + btoi(cfg.Bootstrap) + btoi(len(cfg.Join) > 0); ways > 1 {
		return fail(stderr, "server", fmt.Errorf("give one of --peers, --bootstrap and --join"))
	}
	var parentGone <-chan struct{}
	if stopWith != 0 {
		if stopWith < 0 {
			return fail(stderr, "server", fmt.Errorf("--stop-with-pid %d: not a process ID", stopWith))
		}
		var err error
		if parentGone, err = exited(stopWith); err != nil {
			return fail(stderr, "server", fmt.Errorf("--stop-with-pid: %w", err))
		}
	}
	cfg.Logger = hclog.New(&hclog.LoggerOptions{Name: "raftps", Level: hclog.LevelFromString(logLevel), Output: stderr})
	if cfg.Raft.NoSync {
		cfg.Logger.Warn("--unsafe-no-fsync: the Raft logs are not fsynced; a machine crash can lose acknowledged updates")
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

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
