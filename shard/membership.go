package shard

import (
	"encoding/json"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/memberlist"
)

// Node liveness as gossip (memberlist) tells it.
const (
	StateAlive   = "alive"
	StateSuspect = "suspect"
	StateDead    = "dead"
)

// MembershipConfig configures a node's gossip membership. Zero durations
// take memberlist's LAN defaults (probe every 1s, a dead node declared
// about 5s after it stops answering in a small cluster).
type MembershipConfig struct {
	// Addr is the gossip address (UDP and TCP) to bind and advertise;
	// empty: DefaultGossipAddr of the node's gRPC address.
	Addr string
	// Join lists the other nodes' gossip addresses; empty: the
	// DefaultGossipAddr of every other peer.
	Join []string
	// ProbeInterval, ProbeTimeout and GossipInterval are memberlist's
	// settings of the same names; SuspicionMult likewise (0: default).
	ProbeInterval  time.Duration
	ProbeTimeout   time.Duration
	GossipInterval time.Duration
	SuspicionMult  int
	// RejoinInterval is how often the node joins again the peers it does
	// not see alive (a restarted or partitioned peer is otherwise never
	// probed again); 0: 5s.
	RejoinInterval time.Duration

	fault *netFault // set by the node with NodeConfig.FaultInjection
}

// nodeMeta is what a node gossips about itself (memberlist NodeMeta).
type nodeMeta struct {
	ID   string `json:"id"`
	Addr string `json:"addr"`
	// The node's cluster map version and the number of shard groups it
	// leads, as of its last gossip update.
	MapVersion uint64 `json:"v,omitempty"`
	Leaders    uint32 `json:"l,omitempty"`
}

// MemberInfo is one node as this node's gossip view has it.
type MemberInfo struct {
	ID    string
	Addr  string // gRPC address
	State string // StateAlive, StateSuspect or StateDead
	// Since is when this node last saw the state change (for a node never
	// heard from: when this node started gossiping).
	Since time.Time
	// What the node last gossiped: its map version and leader count.
	MapVersion uint64
	Leaders    uint32
}

// membership runs a node's memberlist and tracks every node's liveness.
//
// Concurrency: memberlist calls the delegate methods from its goroutines,
// some with its node lock held, so they only copy what they need under
// mu and never call memberlist. members and lastAck are guarded by mu; ml is
// set before rejoinLoop starts and never changes.
type membership struct {
	peers []Peer // the static peer list: nodes expected even if never heard
	join  []string
	start time.Time
	log   hclog.Logger
	ml    *memberlist.Memberlist
	every time.Duration

	// probe and probeTimeout are memberlist's ProbeInterval and
	// ProbeTimeout: they set how long a node may go without answering this
	// node's probes before it is shown suspect (0: never).
	probe, probeTimeout time.Duration

	mu      sync.Mutex
	self    nodeMeta
	members map[string]*MemberInfo // by node ID
	lastAck map[string]time.Time   // by node ID: its last answer to a probe of ours
	known   map[string]string      // node ID -> gossip address, from the cluster map

	stop chan struct{}
	wg   sync.WaitGroup
}

func newMembership(cfg MembershipConfig, self nodeMeta, peers []Peer, log hclog.Logger) (*membership, error) {
	addr := cfg.Addr
	if addr == "" {
		var err error
		if addr, err = DefaultGossipAddr(self.Addr); err != nil {
			return nil, fmt.Errorf("gossip address: %w", err)
		}
	}
	join := cfg.Join
	if len(join) == 0 {
		for _, p := range peers {
			if p.ID == self.ID {
				continue
			}
			a, err := GossipAddrOfPeer(p.PeerAddr)
			if err != nil {
				return nil, fmt.Errorf("gossip address of peer %s: %w", p.ID, err)
			}
			join = append(join, a)
		}
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("gossip address %q: %w", addr, err)
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return nil, fmt.Errorf("gossip address %q: bad port", addr)
	}
	m := &membership{
		self: self, peers: peers, join: join, log: log,
		members: map[string]*MemberInfo{},
		lastAck: map[string]time.Time{},
		known:   map[string]string{},
		start:   time.Now(),
		every:   cfg.RejoinInterval,
		stop:    make(chan struct{}),
	}
	if m.every <= 0 {
		m.every = 5 * time.Second
	}
	mc := memberlist.DefaultLANConfig()
	mc.Name = self.ID
	mc.BindAddr, mc.BindPort = host, p
	mc.AdvertiseAddr, mc.AdvertisePort = host, p
	nt, err := memberlist.NewNetTransport(&memberlist.NetTransportConfig{BindAddrs: []string{host}, BindPort: p,
		Logger: log.StandardLogger(&hclog.StandardLoggerOptions{InferLevels: true})})
	if err != nil {
		return nil, fmt.Errorf("gossip on %s: %w", addr, err)
	}
	if p == 0 { // as memberlist does when it makes the transport itself
		p = nt.GetAutoBindPort()
		mc.BindPort, mc.AdvertisePort = p, p
	}
	mc.Transport = newGossipTransport(nt, cfg.fault)
	if cfg.ProbeInterval > 0 {
		mc.ProbeInterval = cfg.ProbeInterval
	}
	if cfg.ProbeTimeout > 0 {
		mc.ProbeTimeout = cfg.ProbeTimeout
	}
	if cfg.GossipInterval > 0 {
		mc.GossipInterval = cfg.GossipInterval
	}
	if cfg.SuspicionMult > 0 {
		mc.SuspicionMult = cfg.SuspicionMult
	}
	m.probe, m.probeTimeout = mc.ProbeInterval, mc.ProbeTimeout
	mc.Delegate = metaDelegate{m}
	mc.Events = eventDelegate{m}
	mc.Ping = pingDelegate{m}
	mc.LogOutput = nil
	mc.Logger = log.StandardLogger(&hclog.StandardLoggerOptions{InferLevels: true})
	if len(m.metaBytes()) > memberlist.MetaMaxSize {
		mc.Transport.Shutdown()
		return nil, fmt.Errorf("gossip metadata of node %s is %d bytes, over memberlist's %d", self.ID, len(m.metaBytes()), memberlist.MetaMaxSize)
	}
	m.ml, err = memberlist.Create(mc)
	if err != nil {
		mc.Transport.Shutdown() // memberlist shuts down only a transport it made
		return nil, fmt.Errorf("gossip on %s: %w", addr, err)
	}
	m.log.Info("gossiping", "addr", addr, "join", join)
	m.wg.Go(m.rejoinLoop)
	return m, nil
}

func (m *membership) metaBytes() []byte {
	m.mu.Lock()
	self := m.self
	m.mu.Unlock()
	b, _ := json.Marshal(self)
	return b
}

// setLocal updates what this node gossips about itself: its map version
// and leader count. It must not be called from a memberlist delegate.
func (m *membership) setLocal(version uint64, leaders uint32) {
	m.mu.Lock()
	same := m.self.MapVersion == version && m.self.Leaders == leaders
	m.self.MapVersion, m.self.Leaders = version, leaders
	m.mu.Unlock()
	if !same {
		if err := m.ml.UpdateNode(time.Second); err != nil {
			m.log.Debug("gossip metadata update", "error", err)
		}
	}
}

// setKnown tells membership the nodes of the cluster map (ID to gossip
// address): a known node never heard from is dead, and is joined again
// like a static peer.
func (m *membership) setKnown(known map[string]string) {
	m.mu.Lock()
	m.known = known
	m.mu.Unlock()
}

// rejoinLoop joins the peers this node does not see alive: at start, and
// every RejoinInterval, since memberlist never probes a node it declared
// dead again.
func (m *membership) rejoinLoop() {
	t := time.NewTicker(m.every)
	defer t.Stop()
	for {
		// Joining a node already alive is one push/pull exchange: cheap.
		missing := len(m.peers) == 0
		alive := m.aliveIDs()
		for _, p := range m.peers {
			missing = missing || !alive[p.ID]
		}
		join := slices.Clone(m.join)
		m.mu.Lock()
		selfID := m.self.ID
		for id, addr := range m.known {
			if id != selfID && !alive[id] && addr != "" && !slices.Contains(join, addr) {
				join, missing = append(join, addr), true
			}
		}
		m.mu.Unlock()
		if missing && len(join) > 0 {
			if n, err := m.ml.Join(join); err != nil {
				m.log.Debug("gossip join", "addrs", join, "joined", n, "error", err)
			}
		}
		select {
		case <-m.stop:
			return
		case <-t.C:
		}
	}
}

func (m *membership) aliveIDs() map[string]bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string]bool{}
	for id, mi := range m.members {
		if mi.State != StateDead {
			out[id] = true
		}
	}
	return out
}

// event records a memberlist event about node n. Called by memberlist with
// its node lock held: n may be read, memberlist may not be called.
func (m *membership) event(n *memberlist.Node, state string) {
	mi := MemberInfo{ID: n.Name, State: state, Since: time.Now()}
	var meta nodeMeta
	if err := json.Unmarshal(n.Meta, &meta); err == nil && meta.ID != "" {
		mi.ID, mi.Addr, mi.MapVersion, mi.Leaders = meta.ID, meta.Addr, meta.MapVersion, meta.Leaders
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if old := m.members[mi.ID]; old != nil && old.State != state {
		m.log.Info("node liveness changed", "member", mi.ID, "from", old.State, "to", state)
	} else if old != nil {
		mi.Since = old.Since
	}
	if mi.Addr == "" {
		if old := m.members[mi.ID]; old != nil {
			mi.Addr = old.Addr
		}
	}
	m.members[mi.ID] = &mi
	if state == StateAlive {
		m.lastAck[mi.ID] = time.Now()
	}
}

// ack records that node id answered a probe of this node's.
func (m *membership) ack(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.lastAck[id] = time.Now()
}

// Members returns every node this node knows of, by gossip or from the
// static peer list, sorted by ID. A peer never heard from is dead; a node
// that left gracefully is dead too.
func (m *membership) Members() []MemberInfo {
	now := time.Now()
	m.mu.Lock()
	// memberlist has no event for suspicion and does not show its own
	// suspect state, so a node alive by gossip is shown suspect once it has
	// left this node's probes unanswered for longer than memberlist's
	// round-robin probing allows: every other node is probed once per pass
	// of n-1 probe intervals, and two passes may shuffle it from first to
	// last. memberlist then declares it dead after the suspicion timeout,
	// unless it answers (or refutes) first.
	alive := 0
	for _, mi := range m.members {
		if mi.State == StateAlive {
			alive++
		}
	}
	suspectAfter := time.Duration(2*max(1, alive-1))*m.probe + m.probeTimeout
	out := make([]MemberInfo, 0, len(m.members)+len(m.peers))
	seen := map[string]bool{}
	for _, mi := range m.members {
		c := *mi
		if c.State == StateAlive && c.ID != m.self.ID && m.probe > 0 && now.Sub(m.lastAck[c.ID]) > suspectAfter {
			c.State, c.Since = StateSuspect, m.lastAck[c.ID].Add(suspectAfter)
		}
		out = append(out, c)
		seen[c.ID] = true
	}
	for id := range m.known {
		if !seen[id] {
			out = append(out, MemberInfo{ID: id, State: StateDead, Since: m.start})
			seen[id] = true
		}
	}
	m.mu.Unlock()
	for _, p := range m.peers {
		if !seen[p.ID] {
			// Never heard from: its client address is unknown until it
			// registers.
			out = append(out, MemberInfo{ID: p.ID, State: StateDead, Since: m.start})
		}
	}
	slices.SortFunc(out, func(a, b MemberInfo) int {
		switch {
		case a.ID < b.ID:
			return -1
		case a.ID > b.ID:
			return 1
		}
		return 0
	})
	return out
}

// close leaves the cluster gracefully (others see this node dead at once
// instead of after the suspicion timeout), then stops gossiping.
func (m *membership) close() error {
	close(m.stop)
	if err := m.ml.Leave(500 * time.Millisecond); err != nil {
		m.log.Warn("leaving the gossip cluster", "error", err)
	}
	err := m.ml.Shutdown()
	m.wg.Wait()
	return err
}

type metaDelegate struct{ m *membership }

func (d metaDelegate) NodeMeta(limit int) []byte {
	b := d.m.metaBytes()
	if len(b) > limit {
		return nil
	}
	return b
}
func (metaDelegate) NotifyMsg([]byte)                {}
func (metaDelegate) GetBroadcasts(int, int) [][]byte { return nil }
func (metaDelegate) LocalState(bool) []byte          { return nil }
func (metaDelegate) MergeRemoteState([]byte, bool)   {}

type pingDelegate struct{ m *membership }

func (pingDelegate) AckPayload() []byte { return nil }
func (d pingDelegate) NotifyPingComplete(other *memberlist.Node, _ time.Duration, _ []byte) {
	d.m.ack(other.Name)
}

type eventDelegate struct{ m *membership }

func (d eventDelegate) NotifyJoin(n *memberlist.Node)   { d.m.event(n, StateAlive) }
func (d eventDelegate) NotifyLeave(n *memberlist.Node)  { d.m.event(n, StateDead) }
func (d eventDelegate) NotifyUpdate(n *memberlist.Node) { d.m.event(n, StateAlive) }
