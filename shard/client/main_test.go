package client_test

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/raftps/raftps/replication"
	"github.com/raftps/raftps/shard"
	"github.com/raftps/raftps/shard/membership"
)

// TestMain starts a 3-node cluster on loopback for the examples, and stops
// it when they are done.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "raftps-client-example")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	nodes, err := startCluster(dir, 3)
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting the examples' cluster:", err)
		os.Exit(1)
	}
	code := m.Run()
	for _, n := range nodes {
		n.Close()
	}
	os.RemoveAll(dir)
	os.Exit(code)
}

func startCluster(dir string, n int) ([]*shard.Node, error) {
	var ls []net.Listener
	for range 3 * n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close()
		ls = append(ls, l)
	}
	addr := func(i int) string { return ls[i].Addr().String() }
	var peers []shard.Peer
	for i := range n {
		peers = append(peers, shard.Peer{ID: fmt.Sprintf("n%d", i+1), PeerAddr: addr(n + i)})
	}
	for _, l := range ls {
		l.Close()
	}
	raft := replication.RaftConfig{HeartbeatTimeout: 150 * time.Millisecond, ElectionTimeout: 150 * time.Millisecond,
		LeaderLeaseTimeout: 100 * time.Millisecond, CommitTimeout: 2 * time.Millisecond, NoSync: true}
	var nodes []*shard.Node
	for i, p := range peers {
		cfg := shard.NodeConfig{ID: p.ID, Addr: addr(i), PeerAddr: p.PeerAddr, DataDir: filepath.Join(dir, p.ID), Peers: peers, Raft: raft, Insecure: true,
			Gossip: membership.Config{Addr: addr(2*n + i), ProbeInterval: 200 * time.Millisecond, ProbeTimeout: 100 * time.Millisecond,
				GossipInterval: 50 * time.Millisecond}}
		nd, err := shard.StartNode(cfg)
		if err != nil {
			for _, o := range nodes {
				o.Close()
			}
			return nil, err
		}
		nodes = append(nodes, nd)
		cluster = append(cluster, cfg.Addr)
	}
	// Ready once every node sees every node alive and in its map: then
	// tables are placed on all of them.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		ready := true
		for _, nd := range nodes {
			alive := 0
			for _, m := range nd.Members() {
				if m.State == membership.Alive {
					alive++
				}
			}
			ready = ready && alive == n && len(nd.ClusterMap().Nodes) == n
		}
		if ready {
			return nodes, nil
		}
		if time.Now().After(deadline) {
			for _, o := range nodes {
				o.Close()
			}
			return nil, fmt.Errorf("the nodes did not all see each other alive and registered within 30s")
		}
	}
}
