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
		cfg      shard.NodeConfig
		peers    string
		join     string
		logLevel string
	)
	d := replication.DefaultRaftConfig()
	fs.StringVar(&cfg.ID, "id", "", "this node's ID, unique in the cluster (required)")
	fs.StringVar(&cfg.Addr, "addr", "", "gRPC address to listen on and advertise, e.g. 127.0.0.1:7001 (required)")
	fs.StringVar(&cfg.HTTPAddr, "http", "", "HTTP address for /healthz and /debug/pprof (empty: none)")
	fs.StringVar(&cfg.DataDir, "data-dir", "", "directory for this node's Raft logs and snapshots (required)")
	fs.StringVar(&peers, "peers", "", "every node of the cluster as ID=ADDR,... including this one (required)")
	fs.StringVar(&cfg.Gossip.Addr, "gossip-addr", "", fmt.Sprintf("memberlist gossip address (UDP and TCP) to bind and advertise (default: the --addr host, port + %d)", shard.GossipPortOffset))
	fs.StringVar(&join, "gossip-join", "", fmt.Sprintf("gossip addresses of other nodes to join, comma-separated (default: each --peers address with port + %d)", shard.GossipPortOffset))
	fs.DurationVar(&cfg.Raft.HeartbeatTimeout, "heartbeat-timeout", d.HeartbeatTimeout, "Raft heartbeat timeout: how long followers wait for a dead leader")
	fs.DurationVar(&cfg.Raft.ElectionTimeout, "election-timeout", d.ElectionTimeout, "Raft election timeout")
	fs.DurationVar(&cfg.Raft.LeaderLeaseTimeout, "leader-lease-timeout", d.LeaderLeaseTimeout, "Raft leader lease timeout (at most the heartbeat timeout)")
	fs.DurationVar(&cfg.Raft.CommitTimeout, "commit-timeout", d.CommitTimeout, "how often an idle Raft leader tells followers the commit index (each costs CPU per group)")
	fs.Uint64Var(&cfg.Raft.SnapshotThreshold, "snapshot-threshold", d.SnapshotThreshold, "log entries between snapshots")
	fs.Uint64Var(&cfg.Raft.TrailingLogs, "trailing-logs", d.TrailingLogs, "log entries kept after a snapshot")
	fs.IntVar(&cfg.MaxMessageBytes, "max-message-bytes", shard.DefaultMaxMessageBytes, "largest gRPC message accepted")
	fs.StringVar(&logLevel, "log-level", "info", "trace, debug, info, warn or error")
	if rc := parse(fs, args, stderr); rc >= 0 {
		return rc
	}
	for _, p := range strings.Split(peers, ",") {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		id, addr, ok := strings.Cut(p, "=")
		if !ok {
			return fail(stderr, "server", fmt.Errorf("--peers: %q is not ID=ADDR", p))
		}
		cfg.Peers = append(cfg.Peers, shard.Peer{ID: id, Addr: addr})
	}
	for _, a := range strings.Split(join, ",") {
		if a = strings.TrimSpace(a); a != "" {
			cfg.Gossip.Join = append(cfg.Gossip.Join, a)
		}
	}
	cfg.Logger = hclog.New(&hclog.LoggerOptions{Name: "raftps", Level: hclog.LevelFromString(logLevel), Output: stderr})
	node, err := shard.StartNode(cfg)
	if err != nil {
		return fail(stderr, "server", err)
	}
	fmt.Fprintf(stdout, "raftps server %s serving on %s\n", cfg.ID, cfg.Addr)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	s := <-sig
	cfg.Logger.Info("shutting down", "signal", s.String())
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
