package membership

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
	"github.com/raftps/raftps/shard/netfault"
)

// Node liveness as gossip (memberlist) tells it: a Member's State.
const (
	Alive   = "alive"
	Suspect = "suspect"
	Dead    = "dead"
)

// Config configures a node's gossip membership. Zero durations take
// memberlist's LAN defaults (probe every 1s, a dead node declared about 5s
// after it stops answering in a small cluster).
type Config struct {
	// Addr is the gossip address (UDP and TCP) to bind and advertise;
	// port 0 picks a free one. The node fills in its default.
	Addr string
	// Join lists the other nodes' gossip addresses, joined at start and
	// again while some node expected is not seen alive (see New). The node
	// fills in its default from its peer list.
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
	// Keys encrypt and authenticate all gossip (memberlist's keyring, with
	// GossipVerifyIncoming and GossipVerifyOutgoing on): the first is sent
	// with, every one is accepted (certs.LoadGossipKeys). None: gossip is
	// plaintext and unauthenticated (a node run with --insecure).
	Keys [][]byte
}

// Local is what the node running the membership tells it about itself and
// the cluster, as opposed to the settings in Config.
type Local struct {
	// ID is this node's ID (its memberlist name), Addr its client address:
	// what it gossips about itself, with its map version and leader count
	// (SetLocal).
	ID   string
	Addr string
	// Expect lists the IDs of the nodes expected even if never heard from
	// (a node's static peers): Members shows such a node dead, and the
	// rejoin loop joins again while one is not seen alive.
	Expect []string
	// Faults, if set, applies the node's fault injection to gossip (see
	// gossipTransport); nil: none.
	Faults *netfault.Faults
	// GossipAddrOf, if set, is the gossip address the cluster map records
	// for a node ID ("" if none): a member gossiping under that name from
	// another address is refused, so that no node gossips as another.
	GossipAddrOf func(id string) string
	// Features is a bit set of what this node's build can do that an
	// older one cannot (api.NodeFeatures), gossiped so that the cluster
	// turns a feature on only once every node has it.
	Features uint32
	Logger   hclog.Logger // nil: none
}

// nodeMeta is what a node gossips about itself (memberlist NodeMeta).
type nodeMeta struct {
	ID   string `json:"id"`
	Addr string `json:"addr"`
	// The node's cluster map version and the number of shard groups it
	// leads, as of its last gossip update.
	MapVersion uint64 `json:"v,omitempty"`
	Leaders    uint32 `json:"l,omitempty"`
	// Local.Features; an older build gossips none (and ignores the field).
	Features uint32 `json:"f,omitempty"`
}

// Member is one node as this node's gossip view has it.
type Member struct {
	ID    string
	Addr  string // client (gRPC) address
	State string // Alive, Suspect or Dead
	// Since is when this node last saw the state change (for a node never
	// heard from: when this node started gossiping).
	Since time.Time
	// What the node last gossiped: its map version, leader count and
	// features (Local.Features).
	MapVersion uint64
	Leaders    uint32
	Features   uint32
}

// Membership runs a node's memberlist and tracks every node's liveness.
//
// Concurrency: its methods are safe for concurrent use, except that
// SetLocal must not be called from a memberlist delegate. memberlist calls
// the delegate methods from its goroutines, some with its node lock held, so
// they only copy what they need under mu and never call memberlist. self,
// members, lastAck and known are guarded by mu; ml is set before rejoinLoop
// starts and never changes.
type Membership struct {
	expect []string // IDs of the nodes expected even if never heard from
	join   []string
	start  time.Time
	log    hclog.Logger
	ml     *memberlist.Memberlist
	every  time.Duration

	// probe and probeTimeout are memberlist's ProbeInterval and
	// ProbeTimeout: they set how long a node may go without answering this
	// node's probes before it is shown suspect (0: never).
	probe, probeTimeout time.Duration

	mu      sync.Mutex
	self    nodeMeta
	members map[string]*Member   // by node ID
	lastAck map[string]time.Time // by node ID: its last answer to a probe of ours
	known   map[string]string    // node ID -> gossip address, from the cluster map

	stop chan struct{}
	wg   sync.WaitGroup
}

// New starts gossiping on cfg.Addr and joins cfg.Join, then keeps joining
// again, every RejoinInterval, while a node of local.Expect or of the
// cluster map (SetKnown) is not seen alive. Close stops it.
func New(cfg Config, local Local) (*Membership, error) {
	log := local.Logger
	if log == nil {
		log = hclog.NewNullLogger()
	}
	self := nodeMeta{ID: local.ID, Addr: local.Addr, Features: local.Features}
	addr, join := cfg.Addr, cfg.Join
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("gossip address %q: %w", addr, err)
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return nil, fmt.Errorf("gossip address %q: bad port", addr)
	}
	m := &Membership{
		self: self, expect: local.Expect, join: join, log: log,
		members: map[string]*Member{},
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
	mc.Transport = newGossipTransport(nt, local.Faults)
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
	if len(cfg.Keys) > 0 {
		if mc.Keyring, err = memberlist.NewKeyring(cfg.Keys[1:], cfg.Keys[0]); err != nil {
			mc.Transport.Shutdown()
			return nil, fmt.Errorf("gossip keyring: %w", err)
		}
		mc.GossipVerifyIncoming, mc.GossipVerifyOutgoing = true, true
	}
	if local.GossipAddrOf != nil {
		mc.Alive = aliveDelegate{self: self.ID, addrOf: local.GossipAddrOf}
	}
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

func (m *Membership) metaBytes() []byte {
	m.mu.Lock()
	self := m.self
	m.mu.Unlock()
	b, _ := json.Marshal(self)
	return b
}

// SetLocal updates what this node gossips about itself: its map version
// and leader count. It must not be called from a memberlist delegate.
func (m *Membership) SetLocal(version uint64, leaders uint32) {
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

// SetKnown tells membership the nodes of the cluster map (ID to gossip
// address): a known node never heard from is dead, and is joined again
// like an expected one. The map is kept, not copied.
func (m *Membership) SetKnown(known map[string]string) {
	m.mu.Lock()
	m.known = known
	m.mu.Unlock()
}

// rejoinLoop joins the peers this node does not see alive: at start, and
// every RejoinInterval, since memberlist never probes a node it declared
// dead again.
func (m *Membership) rejoinLoop() {
	t := time.NewTicker(m.every)
	defer t.Stop()
	for {
		// Joining a node already alive is one push/pull exchange: cheap.
		missing := len(m.expect) == 0
		alive := m.AliveIDs()
		for _, id := range m.expect {
			missing = missing || !alive[id]
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

// AliveIDs returns the IDs of the nodes gossip has not declared dead
// (suspect ones included).
func (m *Membership) AliveIDs() map[string]bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string]bool{}
	for id, mi := range m.members {
		if mi.State != Dead {
			out[id] = true
		}
	}
	return out
}

// event records a memberlist event about node n. Called by memberlist with
// its node lock held: n may be read, memberlist may not be called.
func (m *Membership) event(n *memberlist.Node, state string) {
	mi := Member{ID: n.Name, State: state, Since: time.Now()}
	var meta nodeMeta
	if err := json.Unmarshal(n.Meta, &meta); err == nil && meta.ID != "" {
		mi.ID, mi.Addr, mi.MapVersion, mi.Leaders, mi.Features = meta.ID, meta.Addr, meta.MapVersion, meta.Leaders, meta.Features
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
	if state == Alive {
		m.lastAck[mi.ID] = time.Now()
	}
}

// ack records that node id answered a probe of this node's.
func (m *Membership) ack(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.lastAck[id] = time.Now()
}

// Members returns every node this node knows of, by gossip, as expected
// (Local.Expect) or from the cluster map (SetKnown), sorted by ID. A peer never heard from is dead; a node
// that left gracefully is dead too.
func (m *Membership) Members() []Member {
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
		if mi.State == Alive {
			alive++
		}
	}
	suspectAfter := time.Duration(2*max(1, alive-1))*m.probe + m.probeTimeout
	out := make([]Member, 0, len(m.members)+len(m.expect))
	seen := map[string]bool{}
	for _, mi := range m.members {
		c := *mi
		if c.State == Alive && c.ID != m.self.ID && m.probe > 0 && now.Sub(m.lastAck[c.ID]) > suspectAfter {
			c.State, c.Since = Suspect, m.lastAck[c.ID].Add(suspectAfter)
		}
		out = append(out, c)
		seen[c.ID] = true
	}
	for id := range m.known {
		if !seen[id] {
			out = append(out, Member{ID: id, State: Dead, Since: m.start})
			seen[id] = true
		}
	}
	m.mu.Unlock()
	for _, id := range m.expect {
		if !seen[id] {
			// Never heard from: its client address is unknown until it
			// registers.
			out = append(out, Member{ID: id, State: Dead, Since: m.start})
		}
	}
	slices.SortFunc(out, func(a, b Member) int {
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

// Close leaves the cluster gracefully (others see this node dead at once
// instead of after the suspicion timeout), then stops gossiping.
func (m *Membership) Close() error {
	close(m.stop)
	if err := m.ml.Leave(500 * time.Millisecond); err != nil {
		m.log.Warn("leaving the gossip cluster", "error", err)
	}
	err := m.ml.Shutdown()
	m.wg.Wait()
	return err
}

// aliveDelegate refuses a member whose gossip address is not the one the
// cluster map records for its name: with the gossip key, a node could
// otherwise announce itself as another and later "leave" in its name.
type aliveDelegate struct {
	self   string // this node's own state is never refused: memberlist needs it
	addrOf func(string) string
}

func (d aliveDelegate) NotifyAlive(n *memberlist.Node) error {
	if n.Name == d.self {
		return nil
	}
	want := d.addrOf(n.Name)
	if host, _, err := net.SplitHostPort(want); err != nil || net.ParseIP(host) == nil {
		return nil // unknown, or a host name: memberlist knows members by IP only
	}
	if got := n.Address(); got != want {
		return fmt.Errorf("gossip member %q at %s: the cluster map has it at %s", n.Name, got, want)
	}
	return nil
}

type metaDelegate struct{ m *Membership }

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

type pingDelegate struct{ m *Membership }

func (pingDelegate) AckPayload() []byte { return nil }
func (d pingDelegate) NotifyPingComplete(other *memberlist.Node, _ time.Duration, _ []byte) {
	d.m.ack(other.Name)
}

type eventDelegate struct{ m *Membership }

func (d eventDelegate) NotifyJoin(n *memberlist.Node)   { d.m.event(n, Alive) }
func (d eventDelegate) NotifyLeave(n *memberlist.Node)  { d.m.event(n, Dead) }
func (d eventDelegate) NotifyUpdate(n *memberlist.Node) { d.m.event(n, Alive) }
