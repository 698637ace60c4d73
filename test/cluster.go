package test

import (
	"os"

	"context"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/raftps/raftps/replication"
	"github.com/raftps/raftps/shard"
	"github.com/raftps/raftps/shard/auth"
	"github.com/raftps/raftps/shard/certs"
	"github.com/raftps/raftps/shard/certs/certstest"
	"github.com/raftps/raftps/shard/client"
	"github.com/raftps/raftps/shard/membership"
	"github.com/raftps/raftps/shard/shardpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// Cluster is an in-process raftps cluster for tests: n real nodes, each with
// its own gRPC server on a 127.0.0.1 port and its own data directory, talking
// over real sockets. Nodes can be killed and restarted from their data.
type Cluster struct {
	t    testing.TB
	tune func(*shard.NodeConfig)
	base string
	// certs holds the cluster's CA and every node's and client's
	// certificates: nodes run secure unless tune sets Insecure.
	certs *certstest.Dir
	// admin: the admin client's files, written once (DialOptions).
	admin     certs.Files
	adminOnce sync.Once
	insecure  bool
	cfgs      []shard.NodeConfig
	mu        sync.Mutex
	nodes     []*shard.Node // nil while down
}

// FastRaft is a Raft configuration for tests: elections in a few hundred
// milliseconds.
func FastRaft() replication.RaftConfig {
	return replication.RaftConfig{
		HeartbeatTimeout: 150 * time.Millisecond, ElectionTimeout: 150 * time.Millisecond,
		LeaderLeaseTimeout: 100 * time.Millisecond, CommitTimeout: 2 * time.Millisecond,
	}
}

// TrainRaft is FastRaft without fsync of the Raft logs, for the tests
// whose subject is training rather than durability. In-process nodes share
// the test's page cache, so a killed node loses nothing either way; what
// fsync adds here is time: a push waits for four fsyncs in a row (leader,
// then follower, two per bbolt commit), which made a logistic-regression
// step 2.3-2.4 times as long on a 2-core host (BenchmarkTrainStep;
// docs/BENCHMARKS.md, "Where push time goes").
func TrainRaft() replication.RaftConfig {
	c := FastRaft()
	c.NoSync = true
	return c
}

// FastGossip is a membership configuration for tests on loopback: a node
// that stops answering is declared dead in about a second and a half.
func FastGossip() membership.Config {
	return membership.Config{
		ProbeInterval: 200 * time.Millisecond, ProbeTimeout: 100 * time.Millisecond,
		GossipInterval: 50 * time.Millisecond, SuspicionMult: 4, RejoinInterval: 300 * time.Millisecond,
	}
}

// StartCluster starts n nodes and waits until the metadata group has a
// leader. Every node is closed when the test ends.
func StartCluster(t testing.TB, n int, raft replication.RaftConfig) *Cluster {
	t.Helper()
	return StartClusterWith(t, n, raft, nil)
}

// StartClusterWith is StartCluster with each node's config passed through
// tune (repair grace, move limits) before it starts.
func StartClusterWith(t testing.TB, n int, raft replication.RaftConfig, tune func(*shard.NodeConfig)) *Cluster {
	t.Helper()
	c := &Cluster{t: t, nodes: make([]*shard.Node, n), tune: tune, base: t.TempDir(), certs: certstest.New(t)}
	var peers []shard.Peer
	addrs := freeAddrs(t, 3*n) // client, gossip, then peer addresses
	for i := range n {
		peers = append(peers, shard.Peer{ID: fmt.Sprintf("n%d", i+1), PeerAddr: addrs[2*n+i]})
	}
	base := c.base
	for i := range n {
		g := FastGossip()
		g.Addr = addrs[n+i]
		for j := range n {
			if j != i {
				g.Join = append(g.Join, addrs[n+j])
			}
		}
		cfg := shard.NodeConfig{ID: peers[i].ID, Addr: addrs[i], PeerAddr: peers[i].PeerAddr, DataDir: filepath.Join(base, peers[i].ID), Peers: peers, Raft: raft, Gossip: g}
		cfg.Logger = testLogger()
		c.secure(&cfg)
		if tune != nil {
			tune(&cfg)
		}
		c.settle(&cfg)
		c.cfgs = append(c.cfgs, cfg)
	}
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { c.Start(i) })
	}
	wg.Wait()
	t.Cleanup(func() {
		for i := range c.nodes {
			c.Kill(i)
		}
	})
	c.WaitMetaLeader(10 * time.Second)
	c.WaitRegistered(n, 10*time.Second)
	return c
}

// WaitRegistered waits until a live node's cluster map lists n nodes.
func (c *Cluster) WaitRegistered(n int, timeout time.Duration) {
	c.t.Helper()
	c.waitFor(timeout, fmt.Sprintf("%d nodes in the cluster map", n), func() bool {
		for i := range c.nodes {
			if nd := c.Node(i); nd != nil && len(nd.ClusterMap().Nodes) >= n {
				return true
			}
		}
		return false
	})
}

// testLogger is the nodes' logger: silent unless RAFTPS_TEST_LOG names a
// level (info, debug, ...), for debugging a failing test.
func testLogger() hclog.Logger {
	lvl := os.Getenv("RAFTPS_TEST_LOG")
	if lvl == "" {
		return hclog.NewNullLogger()
	}
	return hclog.New(&hclog.LoggerOptions{Level: hclog.LevelFromString(lvl), Output: os.Stderr})
}

// freeAddrs returns n distinct 127.0.0.1 addresses whose ports were free a
// moment ago. The listeners are held until all n are chosen: a port closed
// and asked for again at once is often handed out a second time.
func freeAddrs(t testing.TB, n int) []string {
	var addrs []string
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		addrs = append(addrs, l.Addr().String())
	}
	return addrs
}

// AddNode starts a new node that joins the running cluster through the
// others' addresses (--join), and returns its index.
func (c *Cluster) AddNode() int {
	c.t.Helper()
	addrs := freeAddrs(c.t, 3)
	c.mu.Lock()
	i := len(c.cfgs)
	id := fmt.Sprintf("n%d", i+1)
	g := FastGossip()
	g.Addr = addrs[1]
	var join []string
	for _, cfg := range c.cfgs {
		join = append(join, cfg.PeerAddr)
		g.Join = append(g.Join, cfg.Gossip.Addr)
	}
	raft := c.cfgs[0].Raft
	cfg := shard.NodeConfig{ID: id, Addr: addrs[0], PeerAddr: addrs[2], DataDir: filepath.Join(c.base, id), Join: join, Raft: raft, Gossip: g}
	cfg.Logger = testLogger()
	c.secure(&cfg)
	if c.tune != nil {
		c.tune(&cfg)
	}
	c.settle(&cfg)
	c.cfgs = append(c.cfgs, cfg)
	c.nodes = append(c.nodes, nil)
	c.mu.Unlock()
	c.Start(i)
	return i
}

// Len returns the number of nodes, up or down.
func (c *Cluster) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.cfgs)
}

// ID returns node i's ID.
func (c *Cluster) ID(i int) string { return c.cfgs[i].ID }

// Start starts node i (again) from its data directory.
func (c *Cluster) Start(i int) {
	c.mu.Lock()
	cfg := c.cfgs[i]
	c.mu.Unlock()
	n, err := shard.StartNode(cfg)
	if err != nil {
		c.t.Errorf("starting %s: %v", cfg.ID, err)
		return
	}
	c.mu.Lock()
	c.nodes[i] = n
	c.mu.Unlock()
}

// Kill stops node i abruptly (its servers and groups close; nothing is flushed
// that Raft had not already made durable).
func (c *Cluster) Kill(i int) {
	c.mu.Lock()
	n := c.nodes[i]
	c.nodes[i] = nil
	c.mu.Unlock()
	if n != nil {
		if err := n.Close(); err != nil {
			c.t.Logf("closing %s: %v", c.cfgs[i].ID, err)
		}
	}
}

// Node returns node i, or nil while it is down.
func (c *Cluster) Node(i int) *shard.Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[i]
}

// Addrs returns every node's client address.
func (c *Cluster) Addrs() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var a []string
	for _, cfg := range c.cfgs {
		a = append(a, cfg.Addr)
	}
	return a
}

// PeerAddr returns node i's peer address.
func (c *Cluster) PeerAddr(i int) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cfgs[i].PeerAddr
}

// Client returns a client of the cluster, closed when the test ends.
func (c *Cluster) Client() *client.Client {
	return c.ClientWith(func(*client.Config) {})
}

// ClientWith is Client with its config passed through tune first.
func (c *Cluster) ClientWith(tune func(*client.Config)) *client.Client {
	cfg := client.DefaultConfig(c.Addrs()...)
	cfg.RetryTimeout = 20 * time.Second
	cfg.DialOptions = c.DialOptions()
	tune(&cfg)
	cl, err := client.New(cfg)
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { cl.Close() })
	return cl
}

// secure gives a node's config its certificates and gossip key.
func (c *Cluster) secure(cfg *shard.NodeConfig) {
	c.t.Helper()
	cfg.Certs = certstest.Source(c.t, c.certs.Node(cfg.ID), certs.NodeIdentity(cfg.ID))
	keys, err := certs.LoadGossipKeys(filepath.Join(c.certs.Path, certs.GossipKeyFile))
	if err != nil {
		c.t.Fatal(err)
	}
	cfg.Gossip.Keys = keys
}

// settle drops the certificates of a node tune made insecure.
func (c *Cluster) settle(cfg *shard.NodeConfig) {
	if cfg.Insecure {
		cfg.Certs, cfg.Gossip.Keys = nil, nil
		c.insecure = true
	}
}

// Certs is the directory of the cluster's CA and certificates.
func (c *Cluster) Certs() *certstest.Dir { return c.certs }

// DialOptions are a client's credentials for the cluster: an admin's
// client certificate (plaintext if the nodes run insecure).
func (c *Cluster) DialOptions() []grpc.DialOption {
	if c.insecure {
		return []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	// Written once: clients made at the same time (trainers on their
	// goroutines) must not rewrite the files others are reading.
	c.adminOnce.Do(func() { c.admin = c.certs.Client("admin", certs.RoleAdmin) })
	src := certstest.Source(c.t, c.admin, certs.Identity{Kind: certs.KindClient})
	return []grpc.DialOption{grpc.WithTransportCredentials(auth.ClientCredentials(src))}
}

// RawStub is a client API stub of the node at addr, with the admin's
// credentials, for requests the Go client would not send.
func (c *Cluster) RawStub(addr string) shardpb.ParameterServerClient {
	cc, err := grpc.NewClient(addr, append(c.DialOptions(), grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(256<<20)))...)
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { cc.Close() })
	return shardpb.NewParameterServerClient(cc)
}

// PeerDialOptions are a peer's credentials for the cluster's peer
// listeners: node n1's certificate.
func (c *Cluster) PeerDialOptions() []grpc.DialOption {
	if c.insecure {
		return []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	src := certstest.Source(c.t, c.certs.Node("n1"), certs.NodeIdentity("n1"))
	return []grpc.DialOption{grpc.WithTransportCredentials(auth.NodeCredentials(src, func(string) string { return "" }))}
}

// WaitMetaLeader waits until the metadata group has a leader.
func (c *Cluster) WaitMetaLeader(timeout time.Duration) {
	c.t.Helper()
	c.waitFor(timeout, "a metadata leader", func() bool {
		for i := range c.nodes {
			if n := c.Node(i); n != nil && n.MetaRaft().State().String() == "Leader" {
				return true
			}
		}
		return false
	})
}

// Leader returns the index of the node leading table/shard.
func (c *Cluster) Leader(table string, s uint32, timeout time.Duration) int {
	c.t.Helper()
	leader := -1
	c.waitFor(timeout, fmt.Sprintf("a leader of %s/%d", table, s), func() bool {
		for i := range c.nodes {
			if n := c.Node(i); n != nil {
				if g := n.Group(table, s); g != nil && g.IsLeader() {
					leader = i
					return true
				}
			}
		}
		return false
	})
	return leader
}

// WaitConverged waits until every live replica of table/shard has applied the
// same index, and returns their checksums, which the caller compares.
func (c *Cluster) WaitConverged(table string, s uint32, timeout time.Duration) []uint64 {
	c.t.Helper()
	c.waitFor(timeout, fmt.Sprintf("replicas of %s/%d to converge", table, s), func() bool {
		var ix []uint64
		for i := range c.nodes {
			n := c.Node(i)
			if n == nil || !c.holds(n, table, s) {
				continue
			}
			applied, _, ok := replicaOf(n, table, s)
			if !ok {
				return false
			}
			ix = append(ix, applied)
		}
		for _, x := range ix {
			if x != ix[0] {
				return false
			}
		}
		return len(ix) > 0
	})
	var sums []uint64
	for i := range c.nodes {
		if n := c.Node(i); n != nil && c.holds(n, table, s) {
			if _, sum, ok := replicaOf(n, table, s); ok {
				sums = append(sums, sum())
			}
		}
	}
	return sums
}

// replicaOf returns node n's replica of table/s, a Raft group's or a
// chain's: its applied index and its checksum.
func replicaOf(n *shard.Node, table string, s uint32) (applied uint64, checksum func() uint64, ok bool) {
	if g := n.Group(table, s); g != nil {
		return g.AppliedIndex(), g.Table().Checksum, true
	}
	if ch := n.Chain(table, s); ch != nil {
		return ch.AppliedIndex(), ch.Checksum, true
	}
	return 0, nil, false
}

// ShardMap returns table/s's entry in the cluster map of the first live
// node, or nil.
func (c *Cluster) ShardMap(table string, s uint32) *shardpb.ShardMap {
	for i := range c.Len() {
		if n := c.Node(i); n != nil {
			for _, sm := range n.ClusterMap().Shards {
				if sm.Table == table && sm.Shard == s {
					return sm
				}
			}
		}
	}
	return nil
}

// Index returns the index of the node with ID id, or -1.
func (c *Cluster) Index(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, cfg := range c.cfgs {
		if cfg.ID == id {
			return i
		}
	}
	return -1
}

// holds reports whether node n's map places a replica of table/s on it.
func (c *Cluster) holds(n *shard.Node, table string, s uint32) bool {
	for _, sm := range n.ClusterMap().Shards {
		if sm.Table == table && sm.Shard == s {
			return slices.Contains(sm.Replicas, n.ID())
		}
	}
	return false
}

func (c *Cluster) waitFor(timeout time.Duration, what string, cond func() bool) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for !cond() {
		select {
		case <-ctx.Done():
			c.t.Fatalf("timed out after %s waiting for %s", timeout, what)
		case <-time.After(5 * time.Millisecond):
		}
	}
}
