package shard

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/raftps/raftps/shard/api"
	"github.com/raftps/raftps/shard/membership"
	"github.com/raftps/raftps/shard/meta"
	"github.com/raftps/raftps/shard/netfault"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	"github.com/raftps/raftps/replication"
	"github.com/raftps/raftps/replication/chain"
	"github.com/raftps/raftps/shard/shardpb"
	"github.com/raftps/raftps/store"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/reflection"
)

// Peer is a node of the static cluster: its ID and peer address.
type Peer struct {
	ID       string
	PeerAddr string
}

// NodeConfig configures one raftps server process.
type NodeConfig struct {
	// ID is this node's name, unique in the cluster. Addr is the client
	// API's address, listened on and advertised to clients; PeerAddr the
	// peer API's (every Raft group's and chain's traffic and the
	// node-to-node calls), listened on and advertised to the other nodes
	// (default: DefaultPeerAddr(Addr)).
	ID       string
	Addr     string
	PeerAddr string
	// HTTPAddr serves /healthz and /debug/pprof; empty disables it.
	HTTPAddr string
	// DataDir holds the metadata group and every shard replica, one directory
	// each; a node restarted with the same DataDir resumes where it stopped.
	DataDir string
	// How the node finds the cluster, on its first start (a restarted node
	// resumes from DataDir). One of: Peers, a static list of the first
	// nodes, this one included, all of which vote in the metadata group;
	// Bootstrap, this node alone starts a new cluster; Join, peer addresses
	// of running nodes to register with (any one will do).
	Peers     []Peer
	Bootstrap bool
	Join      []string
	// RepairGrace is how long a node must stay dead before the metadata
	// leader replaces its replicas (default DefaultRepairGrace); MaxMoves
	// how many shards may be gaining a replica at once (default
	// DefaultMaxMoves), which bounds the snapshot traffic of repair and
	// rebalancing.
	RepairGrace time.Duration
	MaxMoves    int
	// Raft is the template for every group's Raft settings; ID, NodeID, Dir,
	// Transport and Peers are filled in per group.
	Raft replication.RaftConfig
	// ExpediteElection is how long a shard leader's node may be silent
	// before a follower here starts an election at once rather than on
	// raft's randomised timer (replication.Group.ExpediteElection). Zero
	// means the Raft heartbeat timeout; negative turns it off.
	ExpediteElection time.Duration
	// ChainSilence is how long the metadata leader may go without a message
	// from a node before it removes the node from every chain (a chain
	// stalls while any member is down). Zero means twice the Raft heartbeat
	// timeout, at least 500 ms (a removal costs a catch-up when the node is
	// appended again, so a moment's starvation should not cause one);
	// negative leaves removals to gossip alone.
	ChainSilence time.Duration
	// MaxMessageBytes caps a client API message (default 64 MiB); larger
	// requests are refused with ResourceExhausted. The peer listener has its
	// own, larger limit (replication.MaxRaftMessageBytes).
	MaxMessageBytes int
	// Gossip configures membership by memberlist: the gossip address
	// (default: DefaultGossipAddr(Addr)) and whom to join (default: the
	// gossip address of every peer and join address in the default layout,
	// GossipAddrOfPeer).
	Gossip membership.Config
	// FaultInjection serves /debug/netfault on the HTTP port, through which
	// a test blocks this node's traffic to chosen peers or makes it slow
	// (package netfault): how raftps chaos partitions a cluster on one
	// host. Off by default.
	FaultInjection bool
	Logger         hclog.Logger
}

// DefaultMaxMessageBytes is the default cap on one client API message.
const DefaultMaxMessageBytes = 64 << 20

// clientSlackBytes is how far over MaxMessageBytes the client listener
// admits a message, so that the handlers refuse it with a reason that names
// the limit instead of gRPC's bare ResourceExhausted.
const clientSlackBytes = 1 << 20

// validate reports what is wrong with a config whose defaults are filled
// in, naming the field and value at fault.
func (c NodeConfig) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("node config: %s", fmt.Sprintf(format, args...))
	}
	switch {
	case c.ID == "":
		return bad("ID is empty")
	case c.Addr == "":
		return bad("Addr (the client address) is empty")
	case c.PeerAddr == c.Addr:
		return bad("PeerAddr and Addr are both %s: the client and peer APIs need an address each", c.Addr)
	case c.DataDir == "":
		return bad("DataDir is empty")
	}
	ways := 0
	for _, w := range []bool{len(c.Peers) > 0, c.Bootstrap, len(c.Join) > 0} {
		if w {
			ways++
		}
	}
	if ways > 1 {
		return bad("give one of Peers, Bootstrap and Join")
	}
	if ways == 0 {
		if _, err := os.Stat(filepath.Join(c.DataDir, "meta", "raft.db")); err != nil {
			return bad("data dir %s holds no cluster state: a first start needs Bootstrap (a new cluster), Join (a running one) or Peers", c.DataDir)
		}
	}
	if len(c.Peers) == 0 {
		return nil
	}
	seenID, seenAddr := map[string]bool{}, map[string]bool{}
	self := false
	for _, p := range c.Peers {
		if p.ID == "" || p.PeerAddr == "" {
			return bad("peer %q at %q: both ID and peer address are needed", p.ID, p.PeerAddr)
		}
		if seenID[p.ID] || seenAddr[p.PeerAddr] {
			return bad("peer %s=%s listed twice", p.ID, p.PeerAddr)
		}
		seenID[p.ID], seenAddr[p.PeerAddr] = true, true
		if p.ID == c.ID {
			if p.PeerAddr != c.PeerAddr {
				return bad("this node %s is listed in Peers at %s but its PeerAddr is %s", c.ID, p.PeerAddr, c.PeerAddr)
			}
			self = true
		}
	}
	if !self {
		return bad("this node %s (peer address %s) is not in Peers", c.ID, c.PeerAddr)
	}
	return nil
}

// Node is one running raftps server.
//
// Concurrency: every method is safe for concurrent use. groups is guarded by
// mu; the reconcile goroutine is the only one that adds to it.
type Node struct {
	cfg NodeConfig
	log hclog.Logger
	// The client API (server, on lis at Addr) and the peer API (peerServer,
	// on peerLis at PeerAddr: the Peer service, every Raft group's
	// transport, mux, and every chain's, chainMux).
	lis, peerLis       net.Listener
	server, peerServer *grpc.Server
	http               *http.Server
	mux                *replication.Mux
	chainMux           *chain.Mux
	fault              *netfault.Faults // nil unless NodeConfig.FaultInjection
	meta               *replication.RaftReplica
	metaFSM            *meta.FSM
	members            *membership.Membership
	// gossipAddr is the address this node gossips on.
	gossipAddr string

	mu     sync.RWMutex
	groups map[string]*replication.Group // by api.GroupID
	// metaBarriers and metaVerifies coalesce the metadata leader's
	// barriers and leadership checks, metaReadyTerm is the term in which it
	// last completed a barrier (metaReadIndex); confirmer coalesces a chain
	// member's epoch questions to it (chainconfirm.go).
	metaBarriers  coalescer[struct{}, struct{}]
	metaVerifies  coalescer[struct{}, struct{}]
	metaReadyTerm atomic.Uint64
	confirmer     *chainConfirmer
	// broken: as metadata leader, the chain replicas nodes reported broken.
	broken brokenReports
	// chains: this node's replicas of chain shards, by api.GroupID (chainnode.go).
	chains map[string]*chain.Chain
	// retired: groups this node closed because the map moved them away;
	// their data is deleted once the group's leader confirms the node is
	// out of its configuration (gcRetired). Only reconcileLoop uses it.
	retired map[string]bool
	// leftChains: chain replicas found on disk at start that this node has
	// not opened (yet), each with when gcLeftChains may next ask about it;
	// those the chain went on without are deleted. Only reconcileLoop uses
	// it.
	leftChains map[string]time.Time
	// lastTransfer: when this node last handed a group's leadership to the
	// map's preferred leader. Only reconcileLoop uses it.
	lastTransfer map[string]time.Time
	// drift: when this node, leading a group, first saw its Raft
	// configuration differ from the map entry (by api.GroupID@epoch). Only
	// reconcileLoop uses it.
	drift map[string]time.Time

	// leases: each shard replica's read lease, for bounded reads.
	leaseMu sync.Mutex
	leases  map[string]*readLease
	// served counts the pulls this node served; hot keeps the hot-key
	// state of the shards this node leads or read-replicates.
	served servedCounters
	pushes atomic.Uint64 // pushes received (RAFTPS_TEST_BREAK=drop-acked-push)
	hot    hotState

	// spawnMu guards stopping: goroutines started from request handlers
	// (spawn) must not be added to wg once Close waits on it.
	spawnMu  sync.Mutex
	stopping bool

	kick   chan struct{} // the table list changed
	closed chan struct{}
	wg     sync.WaitGroup
	once   sync.Once
}

// StartNode starts a node: it listens, joins the metadata group and opens a
// replica of every shard of every table it knows.
func StartNode(cfg NodeConfig) (*Node, error) {
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	if cfg.MaxMessageBytes == 0 {
		cfg.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if cfg.RepairGrace <= 0 {
		cfg.RepairGrace = DefaultRepairGrace
	}
	if cfg.MaxMoves <= 0 {
		cfg.MaxMoves = DefaultMaxMoves
	}
	if cfg.PeerAddr == "" && cfg.Addr != "" {
		var err error
		if cfg.PeerAddr, err = DefaultPeerAddr(cfg.Addr); err != nil {
			return nil, fmt.Errorf("node %s: peer address: %w", cfg.ID, err)
		}
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.DataDir, 0o755); err != nil {
		return nil, fmt.Errorf("node %s: %w", cfg.ID, err)
	}
	lis, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("node %s: client listener: %w", cfg.ID, err)
	}
	peerLis, err := net.Listen("tcp", cfg.PeerAddr)
	if err != nil {
		lis.Close()
		return nil, fmt.Errorf("node %s: peer listener: %w", cfg.ID, err)
	}
	n := &Node{
		cfg: cfg, log: cfg.Logger.With("node", cfg.ID), lis: lis, peerLis: peerLis,
		groups: map[string]*replication.Group{}, chains: map[string]*chain.Chain{},
		retired: map[string]bool{}, leftChains: map[string]time.Time{}, lastTransfer: map[string]time.Time{}, drift: map[string]time.Time{},
		leases: map[string]*readLease{},
		kick:   make(chan struct{}, 1),
		closed: make(chan struct{}),
	}
	n.hot.init()
	n.metaBarriers.fn = n.runMetaBarrier
	n.metaVerifies.fn = n.runMetaVerify
	n.confirmer = newChainConfirmer(n)
	muxCfg := replication.MuxConfig{LocalAddr: raft.ServerAddress(cfg.PeerAddr), Logger: n.log.Named("transport")}
	if cfg.FaultInjection {
		n.fault = netfault.New()
		muxCfg.DialOptions = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithContextDialer(n.fault.Dial),
			grpc.WithChainUnaryInterceptor(n.fault.UnaryClient)}
	}
	n.mux, err = replication.NewMux(muxCfg)
	if err != nil {
		lis.Close()
		peerLis.Close()
		return nil, fmt.Errorf("node %s: %w", cfg.ID, err)
	}
	n.chainMux, err = chain.NewMux(chain.MuxConfig{LocalAddr: cfg.PeerAddr, DialOptions: muxCfg.DialOptions, Logger: n.log.Named("chain-transport")})
	if err != nil {
		n.mux.Close()
		lis.Close()
		peerLis.Close()
		return nil, fmt.Errorf("node %s: %w", cfg.ID, err)
	}
	// The peer server admits Raft's messages (MaxRaftMessageBytes, more
	// than a chain message's) and the transports' keepalive pings.
	peerOpts, clientOpts := replication.ServerOptions(), []grpc.ServerOption{}
	if n.fault != nil {
		peerOpts = append(peerOpts, grpc.ChainUnaryInterceptor(n.fault.UnaryServer))
		clientOpts = append(clientOpts, grpc.ChainUnaryInterceptor(n.fault.UnaryServer))
	}
	n.peerServer = grpc.NewServer(peerOpts...)
	n.mux.Register(n.peerServer)
	n.chainMux.Register(n.peerServer)
	shardpb.RegisterPeerServer(n.peerServer, &peerService{n: n})
	// The client server admits a little over MaxMessageBytes, so that a
	// request just over the limit gets the handlers' own refusal, which
	// names the limit and carries its reason (checkSize).
	clientOpts = append(clientOpts, grpc.MaxRecvMsgSize(cfg.MaxMessageBytes+clientSlackBytes), grpc.MaxSendMsgSize(cfg.MaxMessageBytes+clientSlackBytes))
	n.server = grpc.NewServer(clientOpts...)
	shardpb.RegisterParameterServerServer(n.server, &service{n: n})
	reflection.Register(n.server)
	n.metaFSM = meta.New(n.kickReconcile)
	tr, err := n.mux.Transport(api.MetaGroupID)
	if err != nil {
		n.Close()
		return nil, fmt.Errorf("node %s: %w", cfg.ID, err)
	}
	var metaPeers []raft.Server
	switch {
	case len(cfg.Peers) > 0:
		for _, p := range cfg.Peers {
			metaPeers = append(metaPeers, raft.Server{ID: raft.ServerID(p.ID), Address: raft.ServerAddress(p.PeerAddr)})
		}
	case cfg.Bootstrap:
		metaPeers = []raft.Server{{ID: raft.ServerID(cfg.ID), Address: raft.ServerAddress(cfg.PeerAddr)}}
	}
	n.meta, err = replication.OpenRaft(n.raftConfig(api.MetaGroupID, filepath.Join(cfg.DataDir, "meta"), tr, metaPeers), n.metaFSM)
	if err != nil {
		n.Close()
		return nil, fmt.Errorf("node %s: %w", cfg.ID, err)
	}
	gossip, err := cfg.gossipConfig()
	if err != nil {
		n.Close()
		return nil, fmt.Errorf("node %s: %w", cfg.ID, err)
	}
	n.gossipAddr = gossip.Addr
	expect := make([]string, 0, len(cfg.Peers))
	for _, p := range cfg.Peers {
		expect = append(expect, p.ID)
	}
	n.members, err = membership.New(gossip, membership.Local{ID: cfg.ID, Addr: cfg.Addr, Expect: expect, Faults: n.fault, Logger: n.log.Named("memberlist")})
	if err != nil {
		n.Close()
		return nil, fmt.Errorf("node %s: %w", cfg.ID, err)
	}

	// Serve only once the metadata group and the membership exist: the
	// handlers read n.meta and n.members.
	// Raft's first messages to peers fail until they serve too, and are
	// retried.
	n.wg.Go(func() {
		if err := n.peerServer.Serve(peerLis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			n.log.Error("peer server stopped", "error", err)
		}
	})
	n.wg.Go(func() {
		if err := n.server.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			n.log.Error("client server stopped", "error", err)
		}
	})

	n.wg.Go(n.reconcileLoop)
	n.wg.Go(n.schedulerLoop)
	n.wg.Go(n.hotLoop)
	n.wg.Go(n.expediteLoop)
	n.kickReconcile()
	if cfg.HTTPAddr != "" {
		if err := n.startHTTP(); err != nil {
			n.Close()
			return nil, err
		}
	}
	n.log.Info("node started", "addr", cfg.Addr, "peer-addr", cfg.PeerAddr, "gossip-addr", n.gossipAddr, "peers", len(cfg.Peers))
	if testBreak != "" {
		n.log.Error("RAFTPS_TEST_BREAK is set: this node has a deliberate bug, for testing the chaos checkers only", "break", testBreak)
	}
	return n, nil
}

// heartbeatTimeout is the Raft heartbeat timeout of this node's groups, the
// default's if the config leaves it unset.
func (n *Node) heartbeatTimeout() time.Duration {
	if hb := n.cfg.Raft.HeartbeatTimeout; hb > 0 {
		return hb
	}
	return replication.DefaultRaftConfig().HeartbeatTimeout
}

// chainSilence is NodeConfig.ChainSilence with its default applied.
func (n *Node) chainSilence() time.Duration {
	if s := n.cfg.ChainSilence; s != 0 {
		return s
	}
	return max(2*n.heartbeatTimeout(), 500*time.Millisecond)
}

// expediteLoop checks every shard replica on this node, and its metadata
// replica, for a silent leader a tenth of a heartbeat timeout apart: one
// ticker for all groups. The metadata group's failover matters to chain
// tables above all: their members are removed, and their reads confirmed,
// by its leader.
func (n *Node) expediteLoop() {
	silence, hb := n.cfg.ExpediteElection, n.heartbeatTimeout()
	if silence == 0 {
		silence = hb
	}
	if silence < 0 {
		return
	}
	t := time.NewTicker(max(hb/10, 5*time.Millisecond))
	defer t.Stop()
	var groups []*replication.Group
	handedOver := map[string]time.Time{} // by group: when its slow leader here last handed over
	for {
		select {
		case <-n.closed:
			return
		case <-t.C:
		}
		groups = groups[:0]
		n.mu.RLock()
		for _, g := range n.groups {
			groups = append(groups, g)
		}
		n.mu.RUnlock()
		for _, g := range groups {
			if _, err := g.ExpediteElection(silence); err != nil {
				n.log.Warn("expedited election", "error", err)
			}
			if g.SlowLeader() && time.Since(handedOver[g.ID()]) > leaderTransferEvery {
				handedOver[g.ID()] = time.Now()
				n.handOver(g)
			}
		}
		if _, err := n.meta.ExpediteElection(silence); err != nil {
			n.log.Warn("expedited election", "error", err)
		}
	}
}

// handOver makes g's leader here, too slow to confirm its leadership in
// time (replication.Group.SlowLeader), hand leadership to another voter.
func (n *Node) handOver(g *replication.Group) {
	r := g.Raft()
	n.log.Warn("leading too slowly: the last leadership checks each took over half the heartbeat timeout; handing leadership over", "group", g.ID())
	n.spawn(func() {
		if err := replication.Await(r, r.LeadershipTransfer()); err != nil {
			n.log.Info("handing over the leadership of a slow leader", "group", g.ID(), "error", err)
		}
	})
}

// raftConfig is the Raft config of one of this node's groups; peers, if
// set, bootstrap a group that has no state yet.
func (n *Node) raftConfig(group, dir string, tr raft.Transport, peers []raft.Server) replication.RaftConfig {
	rc := n.cfg.Raft
	rc.ID, rc.NodeID, rc.Dir, rc.Transport = group, raft.ServerID(n.cfg.ID), dir, tr
	rc.Peers = peers
	if rc.Logger == nil {
		rc.Logger = n.log.Named(group)
	}
	return rc
}

// spawn runs fn on a goroutine Close waits for, unless Close is already
// waiting; it reports whether fn was started. For goroutines started by
// request handlers, which gRPC's Stop does not wait for.
func (n *Node) spawn(fn func()) bool {
	n.spawnMu.Lock()
	defer n.spawnMu.Unlock()
	if n.stopping {
		return false
	}
	n.wg.Go(fn)
	return true
}

// Addr returns the node's client address.
func (n *Node) Addr() string { return n.cfg.Addr }

// PeerAddr returns the node's peer address.
func (n *Node) PeerAddr() string { return n.cfg.PeerAddr }

// ID returns the node's ID.
func (n *Node) ID() string { return n.cfg.ID }

// Group returns this node's replica of a shard, if it has one.
func (n *Node) Group(table string, shard uint32) *replication.Group {
	n.mu.RLock()
	defer n.mu.RUnlock()
	return n.groups[api.GroupID(table, shard)]
}

// peerStub returns a stub of the peer API of the node at peer address
// addr, over the node's one connection to that peer (the Raft
// transport's).
func (n *Node) peerStub(addr string) (shardpb.PeerClient, error) {
	cc, err := n.mux.Conn(raft.ServerAddress(addr))
	if err != nil {
		return nil, err
	}
	return shardpb.NewPeerClient(cc), nil
}

// Members returns every node of the cluster with its liveness as this
// node's gossip view has it, sorted by ID.
func (n *Node) Members() []membership.Member { return n.members.Members() }

// memberMap returns Members by node ID.
func (n *Node) memberMap() map[string]membership.Member {
	out := map[string]membership.Member{}
	for _, m := range n.Members() {
		out[m.ID] = m
	}
	return out
}

// leaderCount returns how many of this node's shard replicas lead.
func (n *Node) leaderCount() uint32 {
	n.mu.RLock()
	defer n.mu.RUnlock()
	c := uint32(0)
	for _, g := range n.groups {
		if g.IsLeader() {
			c++
		}
	}
	return c
}

// MetaRaft returns the metadata group's Raft instance.
func (n *Node) MetaRaft() *raft.Raft { return n.meta.Raft }

func (n *Node) kickReconcile() {
	select {
	case n.kick <- struct{}{}:
	default:
	}
}

func (n *Node) openGroup(id string, cfg store.TableConfig, peers []raft.Server) error {
	tr, err := n.mux.Transport(id)
	if err != nil {
		return err
	}
	g, err := replication.OpenGroup(replication.GroupConfig{
		RaftConfig: n.raftConfig(id, n.groupDir(id), tr, peers),
		Table:      cfg,
	})
	if err != nil {
		tr.Close()
		return err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	select {
	case <-n.closed:
		g.Close()
		return errors.New("node closed")
	default:
	}
	n.groups[id] = g
	return nil
}

func (n *Node) groupDir(id string) string { return filepath.Join(n.cfg.DataDir, "groups", id) }

// closeGroup closes this node's replica of a group (it stays on disk).
func (n *Node) closeGroup(id string) error {
	n.mu.Lock()
	g := n.groups[id]
	delete(n.groups, id)
	n.mu.Unlock()
	if g == nil {
		return nil
	}
	err := g.Close()
	n.dropLease(g)
	return err
}

func (n *Node) startHTTP() error {
	lis, err := net.Listen("tcp", n.cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("node %s: http: %w", n.cfg.ID, err)
	}
	mux := http.NewServeMux()
	// Profiles are how performance work starts (docs/BENCHMARKS.md); the
	// HTTP port is an operator's port, like /metrics, not a client API.
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	if n.fault != nil {
		mux.Handle("/debug/netfault", n.fault)
	}
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if addr, _ := n.meta.Raft.LeaderWithID(); addr == "" {
			http.Error(w, "no metadata leader", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	n.http = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	n.wg.Go(func() {
		if err := n.http.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			n.log.Error("http server stopped", "error", err)
		}
	})
	return nil
}

// Close stops the node: shard replicas, the metadata group, the servers.
func (n *Node) Close() error {
	var errs []error
	n.once.Do(func() {
		close(n.closed)
		// Leave the gossip first: the others see this node dead at once.
		if n.members != nil {
			if err := n.members.Close(); err != nil {
				errs = append(errs, fmt.Errorf("memberlist: %w", err))
			}
		}
		n.mu.Lock()
		groups, chains := n.groups, n.chains
		n.groups, n.chains = map[string]*replication.Group{}, map[string]*chain.Chain{}
		n.mu.Unlock()
		for id, ch := range chains {
			if err := ch.Close(); err != nil {
				errs = append(errs, fmt.Errorf("chain %s: %w", id, err))
			}
		}
		for id, g := range groups {
			if err := g.Close(); err != nil {
				errs = append(errs, fmt.Errorf("group %s: %w", id, err))
			}
		}
		if n.meta != nil {
			if err := n.meta.Close(); err != nil {
				errs = append(errs, fmt.Errorf("meta: %w", err))
			}
		}
		if n.http != nil {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = n.http.Shutdown(ctx)
			cancel()
		}
		if n.server != nil {
			n.server.Stop()
		}
		if n.peerServer != nil {
			n.peerServer.Stop()
		}
		if n.mux != nil {
			if err := n.mux.Close(); err != nil {
				errs = append(errs, err)
			}
		}
		if n.chainMux != nil {
			if err := n.chainMux.Close(); err != nil {
				errs = append(errs, err)
			}
		}
		n.lis.Close()
		n.peerLis.Close()
		n.spawnMu.Lock()
		n.stopping = true
		n.spawnMu.Unlock()
		n.wg.Wait()
	})
	return errors.Join(errs...)
}

// ClusterMap returns this node's copy of the cluster map (as far as its
// metadata replica has applied).
func (n *Node) ClusterMap() *shardpb.ClusterMap { return n.metaFSM.ClusterMap() }
