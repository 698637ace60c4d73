package shard

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/raftps/raftps/shard/api"
	"github.com/raftps/raftps/shard/certs"
	"github.com/raftps/raftps/shard/diskguard"
	"github.com/raftps/raftps/shard/membership"
	"github.com/raftps/raftps/shard/meta"
	"github.com/raftps/raftps/shard/metrics"
	"github.com/raftps/raftps/shard/netfault"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	"github.com/raftps/raftps/replication"
	"github.com/raftps/raftps/replication/chain"
	"github.com/raftps/raftps/shard/shardpb"
	"github.com/raftps/raftps/store"
	"google.golang.org/grpc"
	"google.golang.org/grpc/reflection"
)

// Peer is a node of the static cluster: its ID and peer address.
type Peer struct {
	ID       string
	PeerAddr string
}

// ParsePeers reads a static cluster's members as "ID=PEER_ADDR,..." (raftps
// server --peers); blanks between commas are skipped.
func ParsePeers(s string) ([]Peer, error) {
	var out []Peer
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		id, addr, ok := strings.Cut(p, "=")
		if !ok || id == "" || addr == "" {
			return nil, fmt.Errorf("peer %q is not ID=PEER_ADDR", p)
		}
		out = append(out, Peer{ID: id, PeerAddr: addr})
	}
	return out, nil
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
	// HTTPAddr serves the dashboard, /metrics, /healthz and (with Pprof)
	// /debug/pprof; empty disables it. With no host (":7101") it binds
	// 127.0.0.1.
	HTTPAddr string
	// NoMetrics records no metrics and serves no /metrics: what the
	// metrics cost is measured against it (make bench-metrics).
	NoMetrics bool
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
	// SharedLog gives every new shard replica its part of the node's shared
	// log (replication.NodeLog: one bbolt file, group commit) instead of a
	// raft-boltdb file of its own. Off by default: on this project's test
	// machine it did not make the cluster's pushes faster
	// (docs/BENCHMARKS.md, "The shared log"). Replicas keep the kind of log
	// they were created with either way; a node with replicas in the shared
	// log opens it whatever this says.
	SharedLog bool
	// BoltLogs gives every new shard replica a raft-boltdb file of its own
	// (a bolt transaction and two fdatasyncs per append) instead of the
	// default, a segment log of its own (replication.SegLog: append-only
	// files, one write and one fdatasync per append; pushes 2x faster,
	// docs/BENCHMARKS.md). The metadata group keeps raft-boltdb either way.
	// SharedLog wins over both; replicas keep the kind of log they were
	// created with.
	BoltLogs bool
	// GossipFeatures, if set, replaces the features this node gossips
	// (api.NodeFeatures): for tests of a cluster of mixed builds.
	GossipFeatures *uint32
	// GroupHeartbeatTimeout is the Raft heartbeat (and election) timeout
	// of shard groups; Raft's fields are the metadata group's. A long one
	// makes idle groups cheap (a leader heartbeats each follower every
	// tenth of it) without slowing failover, which node liveness drives:
	// the Mux pings every peer each PingInterval, and a follower whose
	// leader's node is silent for ExpediteElection starts an election at
	// once (docs/ARCHITECTURE.md, "Idle groups"). Zero means one and a
	// half times the ExpediteElection silence (300 ms at the defaults), so
	// that raft's own timer never races the expedited election
	// (groupHeartbeatTimeout); negative means Raft.HeartbeatTimeout, and
	// so does zero when elections are not expedited. Longer ones (1s) made
	// busy groups cheaper, but a clean-clone make test saw bounded tables
	// without a completed read for 1.2 s after a leader kill, over chaos's
	// 1 s limit. Idle groups go quiet anyway (QuiesceAfter), whatever this
	// is.
	GroupHeartbeatTimeout time.Duration
	// QuiesceAfter is how long a Raft group's log (a shard's, or the
	// metadata group's) must stand still before its replicas switch to
	// QuietHeartbeatTimeout (replication.RaftConfig.QuietAfter): an idle
	// group's leader then heartbeats each follower every 0.5–1 s instead
	// of every 20–40 ms, and the first write wakes it.
	// Zero means DefaultQuiesceAfter; negative turns it off. It is off
	// whenever ExpediteElection or PingInterval is, since those replace a
	// quiet group's slow timers when its leader dies. QuietHeartbeatTimeout
	// zero means replication.DefaultQuietHeartbeatTimeout.
	QuiesceAfter          time.Duration
	QuietHeartbeatTimeout time.Duration
	// DormantAfter is how much longer a shard group must stay quiet to go
	// dormant (replication.RaftConfig.DormantAfter): its leader steps
	// down and none of its replicas runs a timer until a write, a
	// linearizable or bounded read, or a membership change wakes it
	// with an election. Zero means DefaultDormantAfter; negative turns
	// it off. Off whenever QuiesceAfter is. The metadata group never
	// goes dormant.
	DormantAfter time.Duration
	// PingInterval and IdleAppendRefresh are the Mux's
	// (replication.MuxConfig): how often a silent peer node is pinged,
	// and how long an idle append may be answered from the follower's
	// last answer. Zero means the replication package's defaults;
	// negative turns each off.
	PingInterval      time.Duration
	IdleAppendRefresh time.Duration
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
	// Limits are the admission limits (limits.go): message sizes, batch
	// parts, answer bytes, streams per connection. Zero fields get defaults.
	Limits
	// Quotas, enforced while this node leads the metadata group: the most
	// tables the cluster may hold, shard replicas a table creation may
	// leave on any one node, and jobs in the registry (defaults
	// DefaultMaxTables, DefaultMaxReplicasPerNode, DefaultMaxJobs). A
	// creation or join past one is refused with api.ErrQuotaExceeded.
	MaxTables          int
	MaxReplicasPerNode int
	MaxJobs            int
	// Gossip configures membership by memberlist: the gossip address
	// (default: DefaultGossipAddr(Addr)) and whom to join (default: the
	// gossip address of every peer and join address in the default layout,
	// GossipAddrOfPeer).
	Gossip membership.Config
	// DiskMinFree is the free space of DataDir's file system below which
	// the node refuses pushes (ResourceExhausted, "disk full on ID") and
	// its followers take no new log entries, until space returns (default
	// diskguard.DefaultMinFree); DiskReserve the size of the reserve file
	// it keeps in DataDir and deletes when the disk fills regardless
	// (0: none). See package diskguard.
	DiskMinFree uint64
	DiskReserve uint64
	// FaultInjection lets a test block this node's traffic to chosen peers
	// or make it slow (package netfault; BlockPeers, SetDelay), and, in
	// builds with FaultInjectionBuilt only, through /debug/netfault on the
	// HTTP port: how raftps chaos partitions a cluster on one host. Off by
	// default.
	FaultInjection bool
	// Certs is the node's certificate material (shard/certs): both
	// listeners serve TLS 1.3 with it and the node presents it to its
	// peers; every caller is authenticated and checked (docs/SECURITY.md).
	// Required unless Insecure. Gossip's keys are Gossip.Keys.
	Certs *certs.Source
	// Insecure serves both listeners in plaintext and authenticates nobody
	// (raftps server --insecure); the node says so in its log every minute.
	Insecure bool
	// Pprof serves /debug/pprof on the HTTP port.
	Pprof  bool
	Logger hclog.Logger
}

// validate reports what is wrong with a config whose defaults are filled
// in, naming the field and value at fault.
func (c NodeConfig) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("node config: %s", fmt.Sprintf(format, args...))
	}
	// The rules the metadata group applies to a registration
	// (meta.CheckNode), checked before anything is opened.
	if err := meta.CheckNode(&shardpb.ClusterNode{Id: c.ID, Addr: c.Addr, PeerAddr: c.PeerAddr}); err != nil {
		return bad("%v", err)
	}
	switch {
	case c.PeerAddr == c.Addr:
		return bad("PeerAddr and Addr are both %s: the client and peer APIs need an address each", c.Addr)
	case c.DataDir == "":
		return bad("DataDir is empty")
	case c.Certs == nil && !c.Insecure:
		return bad("no certificate material (Certs) and not Insecure")
	case c.Certs != nil && c.Insecure:
		return bad("both certificate material (Certs) and Insecure")
	case !c.Insecure && len(c.Gossip.Keys) == 0:
		return bad("no gossip keys (Gossip.Keys) and not Insecure: gossip would be plaintext")
	}
	if err := c.Limits.validate(); err != nil {
		return err
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
		if err := meta.CheckNode(&shardpb.ClusterNode{Id: p.ID, Addr: p.PeerAddr, PeerAddr: p.PeerAddr}); err != nil {
			return bad("peer %q at %q: %v", p.ID, p.PeerAddr, err)
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
	disk               *diskguard.Guard
	metrics            *metrics.Registry
	meta               *replication.RaftReplica
	metaFSM            *meta.FSM
	members            *membership.Membership
	// gossipAddr is the address this node gossips on.
	gossipAddr string
	// logs is the shared log of the node's shard replicas; nil unless
	// SharedLog or the data dir has one.
	logs *replication.NodeLog

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
	// broken: as metadata leader, the chain replicas nodes reported broken
	// and the replicas they set aside; setAside: this node's (setaside.go).
	broken   brokenReports
	setAside setAsideSet
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
	// knownTables: the tables of the map the last reconcile round saw;
	// sweepDue: the data dir is to be swept for replicas of dropped tables
	// (lifecycle.go). Only reconcileLoop uses them.
	knownTables map[string]bool
	sweepDue    bool
	// incarnations: what replica directories record (lifecycle.go), read
	// once, not once a second per replica; prepareReplicaDir and
	// removeReplicaDir forget theirs. Only reconcileLoop uses it.
	incarnations map[string]uint64
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
	sums   checksumCache // Status's checksums (checksums.go)

	// spawnMu guards stopping: goroutines started from request handlers
	// (spawn) must not be added to wg once Close waits on it.
	spawnMu  sync.Mutex
	stopping bool

	// identity is the data dir's (identity.go), guarded by identityMu;
	// identityConfirmed: the metadata leader confirmed its cluster ID since
	// start (only reconcileLoop uses it). failed is closed, with failErr
	// set, when the node stops itself (fail).
	identityMu        sync.Mutex
	identity          dataIdentity
	identityConfirmed bool
	failOnce          sync.Once
	failed            chan struct{}
	failErr           error

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
	cfg.Limits = cfg.Limits.withDefaults()
	if cfg.RepairGrace <= 0 {
		cfg.RepairGrace = DefaultRepairGrace
	}
	if cfg.MaxMoves <= 0 {
		cfg.MaxMoves = DefaultMaxMoves
	}
	if cfg.MaxTables <= 0 {
		cfg.MaxTables = DefaultMaxTables
	}
	if cfg.MaxReplicasPerNode <= 0 {
		cfg.MaxReplicasPerNode = DefaultMaxReplicasPerNode
	}
	if cfg.MaxJobs <= 0 {
		cfg.MaxJobs = DefaultMaxJobs
	}
	if cfg.PeerAddr == "" && cfg.Addr != "" {
		var err error
		if cfg.PeerAddr, err = DefaultPeerAddr(cfg.Addr); err != nil {
			return nil, fmt.Errorf("node %s: peer address: %w", cfg.ID, err)
		}
	}
	// A data dir of another node is the first thing to say, before any
	// complaint about the rest of the config (which would be written for
	// the wrong node anyway).
	if cfg.DataDir != "" {
		if id, ok, err := readIdentity(cfg.DataDir); err != nil || (ok && id.Node != cfg.ID) {
			if err == nil {
				_, err = openIdentity(cfg.DataDir, cfg.ID)
			}
			return nil, fmt.Errorf("node %s: %w", cfg.ID, err)
		}
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.DataDir, 0o755); err != nil {
		return nil, fmt.Errorf("node %s: %w", cfg.ID, err)
	}
	identity, err := openIdentity(cfg.DataDir, cfg.ID)
	if err != nil {
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
		retired: map[string]bool{}, incarnations: map[string]uint64{}, leftChains: map[string]time.Time{}, lastTransfer: map[string]time.Time{}, drift: map[string]time.Time{},
		leases:  map[string]*readLease{},
		kick:    make(chan struct{}, 1),
		closed:  make(chan struct{}),
		metrics: metrics.New(),
		failed:  make(chan struct{}), identity: identity, sweepDue: true,
	}
	n.hot.init()
	n.metaBarriers.fn = n.runMetaBarrier
	n.metaVerifies.fn = n.runMetaVerify
	n.confirmer = newChainConfirmer(n)
	n.disk, err = diskguard.New(diskguard.Config{Dir: cfg.DataDir, NodeID: cfg.ID, MinFree: cfg.DiskMinFree, Reserve: cfg.DiskReserve, Logger: n.log.Named("disk")})
	if err != nil {
		lis.Close()
		peerLis.Close()
		return nil, fmt.Errorf("node %s: %w", cfg.ID, err)
	}
	if cfg.SharedLog || fileExists(filepath.Join(cfg.DataDir, replication.NodeLogFile)) {
		if n.logs, err = n.openNodeLog(); err != nil {
			n.disk.Close()
			lis.Close()
			peerLis.Close()
			return nil, fmt.Errorf("node %s: %w", cfg.ID, err)
		}
	}
	muxCfg := replication.MuxConfig{LocalAddr: raft.ServerAddress(cfg.PeerAddr), Logger: n.log.Named("transport"),
		Space: n.disk, SpaceExempt: []string{api.MetaGroupID},
		PingInterval: cfg.PingInterval, IdleAppendRefresh: cfg.IdleAppendRefresh,
		DialOptions: []grpc.DialOption{n.peerDialCreds()}, Authorize: n.authorizeRaft}
	if cfg.FaultInjection {
		// TLS runs over the faulty connection.
		n.fault = netfault.New()
		muxCfg.DialOptions = append(muxCfg.DialOptions, grpc.WithContextDialer(n.fault.Dial), grpc.WithChainUnaryInterceptor(n.fault.UnaryClient))
	}
	n.mux, err = replication.NewMux(muxCfg)
	if err != nil {
		n.closeNodeLog()
		n.disk.Close()
		lis.Close()
		peerLis.Close()
		return nil, fmt.Errorf("node %s: %w", cfg.ID, err)
	}
	n.chainMux, err = chain.NewMux(chain.MuxConfig{LocalAddr: cfg.PeerAddr, DialOptions: muxCfg.DialOptions, Authorize: n.authorizeChain, Logger: n.log.Named("chain-transport")})
	if err != nil {
		n.closeNodeLog()
		n.mux.Close()
		n.disk.Close()
		lis.Close()
		peerLis.Close()
		return nil, fmt.Errorf("node %s: %w", cfg.ID, err)
	}
	// Recovery first, so that it sees every panic below it; then the gates
	// (security.go), so that nothing else runs for a call they refuse; then
	// the listener's limits (serverOptions), then the metrics.
	clientGate, peerGate, err := n.listenerOptions()
	if err != nil {
		n.closeNodeLog()
		n.chainMux.Close()
		n.mux.Close()
		lis.Close()
		peerLis.Close()
		return nil, fmt.Errorf("node %s: %w", cfg.ID, err)
	}
	peerOpts := append(append(recoverOptions(n.log), peerGate...), n.serverOptions(true)...)
	clientOpts := append(append(recoverOptions(n.log), clientGate...), n.serverOptions(false)...)
	if !cfg.NoMetrics {
		clientOpts = append(clientOpts, grpc.ChainUnaryInterceptor(n.metrics.UnaryServerInterceptor()))
	}
	if n.fault != nil {
		peerOpts = append(peerOpts, grpc.ChainUnaryInterceptor(n.fault.UnaryServer))
		clientOpts = append(clientOpts, grpc.ChainUnaryInterceptor(n.fault.UnaryServer))
	}
	n.peerServer = grpc.NewServer(peerOpts...)
	n.mux.Register(n.peerServer)
	n.chainMux.Register(n.peerServer)
	shardpb.RegisterPeerServer(n.peerServer, &peerService{n: n})
	n.server = grpc.NewServer(clientOpts...)
	shardpb.RegisterParameterServerServer(n.server, &service{n: n})
	n.metrics.MustRegister(metrics.NewStatusCollector(func(ctx context.Context) (*shardpb.StatusResponse, error) {
		return (&service{n: n}).Status(ctx, &shardpb.StatusRequest{})
	}))
	// Reflection on the client listener only, where the gate lets any
	// authenticated caller use it; never on the peer listener.
	reflection.Register(n.server)
	n.metaFSM = meta.New(n.kickReconcile)
	tr, err := n.mux.Transport(api.MetaGroupID)
	if err != nil {
		n.Close()
		return nil, fmt.Errorf("node %s: %w", cfg.ID, err)
	}
	// Chain reads are confirmed by the metadata leader's VerifyLeader,
	// which must count only answers its followers gave, without delay.
	tr.SendEagerly()
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
	n.members, err = membership.New(gossip, membership.Local{ID: cfg.ID, Addr: cfg.Addr, Expect: expect, Faults: n.fault, GossipAddrOf: n.gossipAddrOf,
		Features: nodeFeatures(cfg), Logger: n.log.Named("memberlist")})
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
	if cfg.Insecure {
		n.wg.Go(n.warnInsecure)
	}
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
	rc := n.raftConfig(id, n.groupDir(id), tr, peers)
	rc.SegLog = !n.cfg.BoltLogs
	if n.cfg.SharedLog {
		rc.NodeLog = n.logs
	} else if n.logs != nil && replication.HasNodeLog(rc.Dir) {
		rc.NodeLog = n.logs
	}
	g, err := replication.OpenGroup(replication.GroupConfig{RaftConfig: rc, Table: cfg})
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

// groupMetrics are the metrics of this node's replica of group id; nil
// (record nothing) with NoMetrics.
func (n *Node) groupMetrics(id string) *replication.GroupMetrics {
	if n.cfg.NoMetrics {
		return nil
	}
	return n.metrics.Replication.Group(id)
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
	n.metrics.Replication.Forget(id)
	return err
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
		if err := n.closeNodeLog(); err != nil {
			errs = append(errs, err)
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
		n.disk.Close()
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
