package replication

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-msgpack/v2/codec"
	"github.com/hashicorp/raft"
	"github.com/raftps/raftps/replication/transportpb"
	"github.com/raftps/raftps/shard/grpcopt"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
)

// Transport errors.
var (
	ErrGroupExists     = errors.New("raft group already open on this node")
	ErrUnknownGroup    = errors.New("raft group not on this node")
	ErrTransportClosed = errors.New("raft transport closed")
)

// Sizes of the Raft transport.
const (
	// MaxAppendEntries is how many entries one AppendEntries carries at
	// most (OpenRaft sets it), and MaxGroupEntryBytes the largest entry a
	// shard group may be configured for (GroupConfig.MaxEntryBytes).
	MaxAppendEntries   = 16
	MaxGroupEntryBytes = 8 << 20
	// MaxRaftMessageBytes bounds one Raft message, and so the receive limit
	// of the peer listener: a full AppendEntries of the largest entries,
	// with 1 MiB for its headers (TestLargestAppendEntries measures it:
	// 16 entries of 8 MiB encode to 128 MiB and 1 KiB). Every other Raft
	// and chain message is smaller: a snapshot chunk is 1 MiB, a chain
	// message at most chain.MaxMessageBytes.
	MaxRaftMessageBytes = MaxAppendEntries*MaxGroupEntryBytes + 1<<20
	snapshotChunkBytes  = 1 << 20
	pipelineDepth       = 128
)

// MuxConfig configures a Mux; zero fields get defaults.
type MuxConfig struct {
	// LocalAddr is this node's gRPC address, as peers dial it.
	LocalAddr raft.ServerAddress
	// DialOptions are used to dial peers (default: insecure credentials).
	DialOptions []grpc.DialOption
	// Timeout bounds AppendEntries, RequestVote, TimeoutNow and RequestPreVote
	// calls (default 5s). InstallSnapshot gets Timeout per 256 MiB as well.
	Timeout time.Duration
	// HeartbeatTimeout bounds one message of heartbeats (default 500ms). A
	// heartbeat answered later than a follower's election timeout is of no
	// use, and while one is in flight to a peer every group's next
	// heartbeats to that peer wait for it: with Timeout instead, a peer that
	// died without a TCP reset (a killed container) and came back heard from
	// none of its leaders for seconds, and its replicas campaigned.
	HeartbeatTimeout time.Duration
	// Authorize, if set, is asked before any group's Raft sees a message
	// (every AppendEntries, heartbeat, vote, pre-vote, TimeoutNow and
	// snapshot), with the group and the sender the message claims: the
	// RPCHeader's ID and peer address (a message without them, or whose
	// deprecated Leader or Candidate field names another address, is
	// refused before). A non-nil error refuses the message; it should be a
	// gRPC status error. The replication package knows nothing of
	// certificates: the node decides who the caller is and whether it may
	// speak for that sender in that group.
	Authorize func(ctx context.Context, group, id, addr string) error
	// Space, if set, is asked before appends with entries and snapshots
	// are taken (admitWrite); SpaceExempt lists the groups whose appends
	// are taken regardless (the metadata group: its entries are small and
	// the cluster needs it).
	Space       DiskSpace
	SpaceExempt []string
	// PingInterval is how often the Mux pings a peer it has not heard from
	// during the interval (default DefaultPingInterval; negative: never),
	// so that LastHeard tells a live node from a dead one within a few
	// intervals however rarely its groups talk. IdleAppendRefresh is how
	// long an idle AppendEntries may be answered from the follower's last
	// answer to the same one rather than sent (default
	// DefaultIdleAppendRefresh; negative: always sent), and IdleAppendFresh
	// how recently the follower's node must have been heard from for that
	// (default 4 × PingInterval). See transport_idle.go.
	PingInterval      time.Duration
	IdleAppendRefresh time.Duration
	IdleAppendFresh   time.Duration
	// HeartbeatDelay is how long raft's periodic heartbeats to a peer wait
	// for other groups' to share a message (default DefaultHeartbeatDelay;
	// negative: none). Leadership checks of reads do not wait.
	HeartbeatDelay time.Duration
	// MsgpackAppends makes this node neither send appends in the binary
	// encoding (appendcodec.go) nor tell peers it reads it, as a build
	// before it did: for tests of a cluster of mixed builds.
	MsgpackAppends bool
	// NoConfirms makes this node neither answer the term checks of reads
	// (transport_confirm.go) nor send them, as a build before them: for
	// tests of a cluster of mixed builds.
	NoConfirms bool
	Logger     hclog.Logger
}

// Mux is one node's Raft transport: it serves the Raft RPCs of every group
// on the node's gRPC server (service raftps.transport.v1.RaftTransport, see
// transportpb) and gives each group its raft.Transport. Every message carries
// its group's ID; one gRPC connection per peer carries every group.
//
// Heartbeats of a group go to its heartbeat handler directly rather than
// through the consumer channel, as in raft's NetworkTransport, so a follower
// busy writing a large batch to disk still answers them and its leader does
// not step down.
//
// Concurrency: all methods are safe for concurrent use. Transports are
// registered and removed under mu; connections are created lazily under
// connMu and shared.
type Mux struct {
	cfg MuxConfig
	log hclog.Logger

	mu     sync.RWMutex // guards groups, closed, added
	groups map[string]*Transport
	closed bool
	added  chan struct{} // closed (and replaced) whenever a group registers

	connMu sync.Mutex // guards conns and hbs
	conns  map[raft.ServerAddress]*grpc.ClientConn
	hbs    map[raft.ServerAddress]*heartbeats

	heard sync.Map // raft.ServerAddress → *peerHeard

	stop    chan struct{}   // closed by Close: ends pingLoop
	stopCtx context.Context // done once Close began: ends pings in flight
	cancel  context.CancelFunc
	wg      sync.WaitGroup

	stats MuxStats
}

// MuxStats counts what a Mux served, for metrics and tests.
type MuxStats struct {
	PipelinedAppends  atomic.Int64 // AppendEntries answered on pipeline streams
	SnapshotsReceived atomic.Int64 // InstallSnapshot streams completed
	SnapshotBytes     atomic.Int64 // snapshot bytes received
	HeartbeatsSent    atomic.Int64 // heartbeats this node's groups sent
	HeartbeatBatches  atomic.Int64 // messages that carried them
	Pings             atomic.Int64 // node pings answered (pingLoop)
	// IdleAppendsAnswered counts AppendEntries without entries answered
	// from the follower's last answer instead of sent (answerIdle).
	IdleAppendsAnswered atomic.Int64
	// DormantAnswers counts a dormant leader's appends answered so that
	// it steps down (answerDormant); DormantWakes the elections Awaken
	// started.
	DormantAnswers atomic.Int64
	DormantWakes   atomic.Int64
	// BinaryAppends counts AppendEntries this node sent in the binary
	// encoding (appendcodec.go).
	BinaryAppends atomic.Int64
	// TermChecksSent counts the term checks of reads this node's groups
	// sent, TermChecksAnswered those it answered (transport_confirm.go).
	// Neither is among the heartbeats.
	TermChecksSent     atomic.Int64
	TermChecksAnswered atomic.Int64
}

// Stats returns the Mux's counters.
func (m *Mux) Stats() *MuxStats { return &m.stats }

// heardFrom notes that peer just answered or sent something.
func (m *Mux) heardFrom(peer raft.ServerAddress) { m.heardEntry(peer) }

func (m *Mux) heardEntry(peer raft.ServerAddress) *peerHeard {
	if peer == "" {
		return nil
	}
	now := time.Now().UnixNano()
	v, ok := m.heard.Load(peer)
	if !ok {
		v, _ = m.heard.LoadOrStore(peer, new(peerHeard))
	}
	h := v.(*peerHeard)
	h.note(now, int64(m.heardGap()))
	return h
}

// heardGap is the longest silence that does not end a streak of hearing
// from a peer: four ping intervals, which a live peer this node pings never
// leaves (0 with pings off: then every message starts a streak, and
// hearing does not look at streaks).
func (m *Mux) heardGap() time.Duration { return 4 * max(m.cfg.PingInterval, 0) }

// peerHeard is what a Mux knows of hearing from one peer node: when it
// last did (unix ns), and since when it has without a gap longer than
// heardGap (the start of the current streak).
type peerHeard struct {
	last, since atomic.Int64
	// takesAppend: the peer's answers said it reads binary appends.
	takesAppend atomic.Bool
}

func (h *peerHeard) note(now, gap int64) {
	if prev := h.last.Swap(now); now-prev > gap {
		h.since.Store(now)
	}
}

// LastHeard is when this node last had a message from peer, whether a
// request from one of its groups or an answer to one of ours; ok is false
// if it never had one. A leader sends each follower a heartbeat every
// tenth of the heartbeat timeout, so a peer that leads or follows any group
// shared with this node is heard from many times a second while it lives:
// clients ask this to tell a dead node from a slow one (see shard's
// PeerContact).
func (m *Mux) LastHeard(peer raft.ServerAddress) (time.Time, bool) {
	v, ok := m.heard.Load(peer)
	if !ok {
		return time.Time{}, false
	}
	return time.Unix(0, v.(*peerHeard).last.Load()), true
}

// heardSince is when this node's current streak of hearing from peer
// began (see peerHeard); ok is false if it never heard from it.
func (m *Mux) heardSince(peer raft.ServerAddress) (time.Time, bool) {
	v, ok := m.heard.Load(peer)
	if !ok {
		return time.Time{}, false
	}
	return time.Unix(0, v.(*peerHeard).since.Load()), true
}

// NewMux returns a Mux for the node at cfg.LocalAddr.
func NewMux(cfg MuxConfig) (*Mux, error) {
	if cfg.LocalAddr == "" {
		return nil, fmt.Errorf("raft transport: LocalAddr is empty")
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 5 * time.Second
	}
	if cfg.Timeout < 0 {
		return nil, fmt.Errorf("raft transport: Timeout = %s (want > 0)", cfg.Timeout)
	}
	if cfg.HeartbeatTimeout == 0 {
		cfg.HeartbeatTimeout = min(500*time.Millisecond, cfg.Timeout)
	}
	if cfg.HeartbeatTimeout < 0 {
		return nil, fmt.Errorf("raft transport: HeartbeatTimeout = %s (want > 0)", cfg.HeartbeatTimeout)
	}
	if cfg.DialOptions == nil {
		cfg.DialOptions = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	if cfg.PingInterval == 0 {
		cfg.PingInterval = DefaultPingInterval
	}
	if cfg.IdleAppendRefresh == 0 {
		cfg.IdleAppendRefresh = DefaultIdleAppendRefresh
	}
	if cfg.IdleAppendFresh == 0 {
		cfg.IdleAppendFresh = 4 * cfg.PingInterval
	}
	if cfg.HeartbeatDelay == 0 {
		cfg.HeartbeatDelay = DefaultHeartbeatDelay
	}
	if cfg.PingInterval < 0 {
		// Without pings, LastHeard is fresh only while groups talk: no
		// idle append may lean on it.
		cfg.IdleAppendRefresh = -1
	}
	cfg.DialOptions = append(cfg.DialOptions, grpc.WithDefaultCallOptions(
		grpc.MaxCallRecvMsgSize(MaxRaftMessageBytes), grpc.MaxCallSendMsgSize(MaxRaftMessageBytes)))
	// Keepalive: a peer that is stopped or cut off without a TCP reset would
	// otherwise leave a pipeline stream blocked in Send on flow control, and
	// raft's Shutdown waits for its replication goroutines.
	cfg.DialOptions = append(cfg.DialOptions, PeerDialOptions()...)
	m := &Mux{cfg: cfg, log: cfg.Logger, groups: map[string]*Transport{}, added: make(chan struct{}), conns: map[raft.ServerAddress]*grpc.ClientConn{}, hbs: map[raft.ServerAddress]*heartbeats{},
		stop: make(chan struct{})}
	m.stopCtx, m.cancel = context.WithCancel(context.Background())
	if cfg.PingInterval > 0 {
		m.wg.Add(1)
		go m.pingLoop(cfg.PingInterval)
	}
	return m, nil
}

// peerConnectParams redial a peer within a second. gRPC's defaults (20 s
// connect timeout, backoff to 2 min) suit clients of a remote service; a
// peer that restarts, or a partition that heals, is back within seconds,
// and every second it is not redialled is a second its replicas hear from
// no leader (Raft) or its chain stalls (chain).
var peerConnectParams = grpc.WithConnectParams(grpc.ConnectParams{MinConnectTimeout: time.Second,
	Backoff: backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second}})

// keepaliveTime is how often an idle connection to a peer is pinged, and how
// long a ping may go unanswered before the connection is closed.
const keepaliveTime = 2 * time.Second

// PeerDialOptions are the options every connection of a node to a peer
// dials with, whichever transport (Raft's Mux, chain replication's) makes
// it: keepalive pings, which ServerOptions permits, so that a connection to
// a peer that vanished without a TCP reset breaks within seconds; and
// peerConnectParams.
func PeerDialOptions() []grpc.DialOption {
	return append(grpcopt.Dial(),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: keepaliveTime, Timeout: keepaliveTime, PermitWithoutStream: true}),
		peerConnectParams,
	)
}

// ServerOptions are what the node's grpc.Server needs for Raft traffic: room
// for a full AppendEntries, and permission for peers' keepalive pings (the
// default policy would answer them with GOAWAY).
func ServerOptions() []grpc.ServerOption {
	return append(grpcopt.Server(),
		grpc.MaxRecvMsgSize(MaxRaftMessageBytes), grpc.MaxSendMsgSize(MaxRaftMessageBytes),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: keepaliveTime / 2, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: keepaliveTime, Timeout: keepaliveTime}),
	)
}

// Register adds the Raft service to the node's gRPC server.
func (m *Mux) Register(s grpc.ServiceRegistrar) {
	transportpb.RegisterRaftTransportServer(s, &muxServer{m: m})
}

// Transport opens the transport of one group on this node.
func (m *Mux) Transport(group string) (*Transport, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, fmt.Errorf("raft group %q: %w", group, ErrTransportClosed)
	}
	if _, ok := m.groups[group]; ok {
		return nil, fmt.Errorf("raft group %q: %w", group, ErrGroupExists)
	}
	t := &Transport{mux: m, group: group, consumer: make(chan raft.RPC)}
	t.ctx, t.cancel = context.WithCancel(context.Background())
	m.groups[group] = t
	close(m.added)
	m.added = make(chan struct{})
	return t, nil
}

// groupWait is how long an append or snapshot for a group this node does
// not (yet) hold waits for it to open. A restarted node opens its replicas
// a second or two after it serves; answering NotFound at once meanwhile
// made each leader's replicator fail in a tight loop, and hashicorp/raft
// backs off exponentially per failure (to 10 s), so the replica then sat
// idle for seconds after it had opened.
const groupWait = time.Second

// lookupWait is lookup, waiting up to groupWait for the group to register.
func (m *Mux) lookupWait(ctx context.Context, group string) (*Transport, error) {
	timer := time.NewTimer(groupWait)
	defer timer.Stop()
	for {
		m.mu.RLock()
		t, added := m.groups[group], m.added
		m.mu.RUnlock()
		if t != nil {
			return t, nil
		}
		select {
		case <-added:
		case <-timer.C:
			return m.lookup(group)
		case <-ctx.Done():
			return m.lookup(group)
		}
	}
}

// awaitReady waits up to groupWait for the connection to a peer to be
// ready, so that while the peer is down a Raft replicator fails about once
// per groupWait rather than every few milliseconds, and so its backoff
// (exponential per failure, see lookupWait) stays short for when the peer
// returns. Waiting longer would hold up raft's Shutdown, which waits for
// its replicators; it ends at once when done (the group's transport) closes.
func awaitReady(cc *grpc.ClientConn, done <-chan struct{}) {
	if st := cc.GetState(); st == connectivity.Ready || st == connectivity.Shutdown {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), groupWait)
	defer cancel()
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		select {
		case <-done:
			cancel()
		case <-stop:
		}
	}()
	for {
		st := cc.GetState()
		if st == connectivity.Ready || st == connectivity.Shutdown {
			return
		}
		cc.Connect()
		if !cc.WaitForStateChange(ctx, st) {
			return
		}
	}
}

func (m *Mux) lookup(group string) (*Transport, error) {
	m.mu.RLock()
	t := m.groups[group]
	m.mu.RUnlock()
	if t == nil {
		return nil, status.Errorf(codes.NotFound, "raft group %q is not on node %s", group, m.cfg.LocalAddr)
	}
	return t, nil
}

func (m *Mux) client(target raft.ServerAddress) (transportpb.RaftTransportClient, error) {
	cc, err := m.Conn(target)
	if err != nil {
		return nil, err
	}
	return transportpb.NewRaftTransportClient(cc), nil
}

// Conn returns the node's one connection to the peer at target, dialed on
// first use and closed by Close. Other services the peer serves on the same
// port (the node's client API, say) use it too, rather than a second
// connection to the same node.
func (m *Mux) Conn(target raft.ServerAddress) (*grpc.ClientConn, error) {
	m.mu.RLock()
	closed := m.closed
	m.mu.RUnlock()
	if closed {
		return nil, fmt.Errorf("raft transport: dialing %s: %w", target, ErrTransportClosed)
	}
	m.connMu.Lock()
	defer m.connMu.Unlock()
	cc, ok := m.conns[target]
	if !ok {
		var err error
		if cc, err = grpc.NewClient(string(target), m.cfg.DialOptions...); err != nil {
			return nil, fmt.Errorf("raft transport: dialing %s: %w", target, err)
		}
		m.conns[target] = cc
	}
	return cc, nil
}

// Close closes every transport and connection.
func (m *Mux) Close() error {
	m.mu.Lock()
	if !m.closed {
		close(m.stop)
		m.cancel()
	}
	m.closed = true
	groups := m.groups
	m.groups = map[string]*Transport{}
	m.mu.Unlock()
	for _, t := range groups {
		t.shut()
	}
	m.wg.Wait()
	m.connMu.Lock()
	defer m.connMu.Unlock()
	var errs []error
	for _, cc := range m.conns {
		errs = append(errs, cc.Close())
	}
	m.conns = map[raft.ServerAddress]*grpc.ClientConn{}
	return errors.Join(errs...)
}

// Transport is one group's raft.Transport over its node's Mux. It implements
// raft.Transport, raft.WithClose and raft.WithPreVote.
type Transport struct {
	mux      *Mux
	group    string
	consumer chan raft.RPC

	// hbMu guards heartbeat, and is read-locked while a heartbeat is in
	// the handler (see dispatch).
	hbMu      sync.RWMutex
	heartbeat func(raft.RPC)

	// ctx is done once the transport is closed. The calls in flight end
	// with it, since raft's Shutdown waits for the replicator making them,
	// and a call to a peer behind a partition would otherwise run its whole
	// Timeout.
	ctx    context.Context
	cancel context.CancelFunc

	idle  idleAppends
	eager atomic.Bool // SendEagerly
	// refusedTransfer is the last transfer vote (an expedited election's
	// or a leadership transfer's) this replica refused: ExpediteElection
	// reads it.
	refusedTransfer atomic.Pointer[refusedVote]
	// quiet is the group's quiescence (transport_quiet.go), nil if it
	// has none.
	quiet atomic.Pointer[quiescence]
	// dormant: the replica is dormant (transport_dormant.go).
	dormant atomic.Bool
	// mayDelay: the group's heartbeat timeout is long enough for its
	// heartbeats to wait HeartbeatDelay (setHeartbeatTimeout).
	mayDelay atomic.Bool
	// raft is the replica's raft once it runs: the term checks of reads
	// read its current term (transport_confirm.go).
	raft atomic.Pointer[raft.Raft]
}

var (
	_ raft.Transport   = (*Transport)(nil)
	_ raft.WithClose   = (*Transport)(nil)
	_ raft.WithPreVote = (*Transport)(nil)
)

func (t *Transport) Consumer() <-chan raft.RPC     { return t.consumer }
func (t *Transport) LocalAddr() raft.ServerAddress { return t.mux.cfg.LocalAddr }

func (t *Transport) SetHeartbeatHandler(cb func(rpc raft.RPC)) {
	t.hbMu.Lock()
	t.heartbeat = cb
	t.hbMu.Unlock()
}

func (t *Transport) EncodePeer(_ raft.ServerID, addr raft.ServerAddress) []byte { return []byte(addr) }
func (t *Transport) DecodePeer(b []byte) raft.ServerAddress                     { return raft.ServerAddress(b) }

// Close removes the group from its Mux: its incoming RPCs are answered
// NotFound and its calls fail with ErrTransportClosed. It returns once no
// heartbeat is inside the heartbeat handler any more, and none enters it
// after: raft's Shutdown does not wait for heartbeats, which the handler
// processes on the caller's goroutine, and one still running when the
// group closes its log store makes raft panic ("failed to save current
// term: database not open"; hashicorp/raft#717, open upstream).
func (t *Transport) Close() error {
	t.mux.mu.Lock()
	if t.mux.groups[t.group] == t {
		delete(t.mux.groups, t.group)
	}
	t.mux.mu.Unlock()
	t.shut()
	t.hbMu.Lock()
	t.heartbeat = nil
	t.hbMu.Unlock()
	return nil
}

func (t *Transport) shut() { t.cancel() }

func (t *Transport) isClosed() error {
	select {
	case <-t.ctx.Done():
		return fmt.Errorf("raft group %q: %w", t.group, ErrTransportClosed)
	default:
		return nil
	}
}

var msgpack = &codec.MsgpackHandle{}

func encode(v any) ([]byte, error) {
	var b []byte
	if err := codec.NewEncoderBytes(&b, msgpack).Encode(v); err != nil {
		return nil, fmt.Errorf("raft transport: encoding %T: %w", v, err)
	}
	return b, nil
}

func decode(b []byte, v any) error {
	if err := codec.NewDecoderBytes(b, msgpack).Decode(v); err != nil {
		return fmt.Errorf("raft transport: decoding %T: %w", v, err)
	}
	return nil
}

// unary makes one request/response call within the transport timeout.
func (t *Transport) unary(target raft.ServerAddress, args, resp any,
	call func(transportpb.RaftTransportClient, context.Context, *transportpb.RPC) (*transportpb.RPC, error)) error {
	return t.unaryWithin(t.mux.cfg.Timeout, target, args, resp, call)
}

func (t *Transport) unaryWithin(timeout time.Duration, target raft.ServerAddress, args, resp any,
	call func(transportpb.RaftTransportClient, context.Context, *transportpb.RPC) (*transportpb.RPC, error)) error {
	if err := t.isClosed(); err != nil {
		return err
	}
	c, err := t.mux.client(target)
	if err != nil {
		return err
	}
	var in *transportpb.RPC
	if ae, ok := args.(*raft.AppendEntriesRequest); ok {
		in, err = t.mux.appendRPC(t.group, target, ae)
	} else {
		var payload []byte
		payload, err = encode(args)
		in = &transportpb.RPC{Group: t.group, Msgpack: payload}
	}
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(t.ctx, timeout)
	defer cancel()
	out, err := call(c, ctx, in)
	if err != nil {
		t.mux.appendFailed(target, in, err)
		if cerr := t.isClosed(); cerr != nil {
			return cerr // cut short by Close
		}
		return fmt.Errorf("raft group %q: %s: %w", t.group, target, err)
	}
	t.mux.answered(target, out)
	return decode(out.Msgpack, resp)
}

func (t *Transport) AppendEntries(_ raft.ServerID, target raft.ServerAddress, args *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) error {
	if t.answerDormant(args, resp) {
		return nil
	}
	if isHeartbeat(args) {
		if !t.eager.Load() {
			return t.sendHeartbeat(target, args, resp, !t.mayDelay.Load())
		}
		return t.sendHeartbeatAlone(target, args, resp)
	}
	if t.answerIdle(target, args, resp) {
		return nil
	}
	if cc, err := t.mux.Conn(target); err == nil {
		awaitReady(cc, t.ctx.Done())
	}
	sent := time.Now()
	err := t.unary(target, args, resp, func(c transportpb.RaftTransportClient, ctx context.Context, r *transportpb.RPC) (*transportpb.RPC, error) {
		return c.AppendEntries(ctx, r)
	})
	t.noteIdle(target, args, resp, sent, err)
	return err
}

func (t *Transport) RequestVote(_ raft.ServerID, target raft.ServerAddress, args *raft.RequestVoteRequest, resp *raft.RequestVoteResponse) error {
	return t.unary(target, args, resp, func(c transportpb.RaftTransportClient, ctx context.Context, r *transportpb.RPC) (*transportpb.RPC, error) {
		return c.RequestVote(ctx, r)
	})
}

func (t *Transport) RequestPreVote(_ raft.ServerID, target raft.ServerAddress, args *raft.RequestPreVoteRequest, resp *raft.RequestPreVoteResponse) error {
	return t.unary(target, args, resp, func(c transportpb.RaftTransportClient, ctx context.Context, r *transportpb.RPC) (*transportpb.RPC, error) {
		return c.RequestPreVote(ctx, r)
	})
}

func (t *Transport) TimeoutNow(_ raft.ServerID, target raft.ServerAddress, args *raft.TimeoutNowRequest, resp *raft.TimeoutNowResponse) error {
	return t.unary(target, args, resp, func(c transportpb.RaftTransportClient, ctx context.Context, r *transportpb.RPC) (*transportpb.RPC, error) {
		return c.TimeoutNow(ctx, r)
	})
}

// muxServer answers the Raft RPCs of every group on the node.
type muxServer struct {
	transportpb.UnimplementedRaftTransportServer
	m *Mux
}

// dispatch hands a decoded request to its group's Raft and waits for the
// answer. Pure heartbeats go to the heartbeat handler.
func (t *Transport) dispatch(ctx context.Context, cmd any, data io.Reader) (any, error) {
	if err := t.authorize(ctx, cmd); err != nil {
		return nil, err
	}
	return t.deliver(ctx, cmd, data)
}

// deliver is dispatch without the authorization: for a message this node
// hands its own replica (ExpediteElection, campaignFirst), which comes
// through no listener and so has no authenticated caller.
func (t *Transport) deliver(ctx context.Context, cmd any, data io.Reader) (any, error) {
	if h, ok := cmd.(raft.WithRPCHeader); ok {
		t.mux.heardFrom(raft.ServerAddress(h.GetRPCHeader().Addr))
	}
	if err := t.mux.admitWrite(t.group, cmd); err != nil {
		return nil, err
	}
	ch := make(chan raft.RPCResponse, 1)
	rpc := raft.RPC{Command: cmd, Reader: data, RespChan: ch}
	if ae, ok := cmd.(*raft.AppendEntriesRequest); ok && isHeartbeat(ae) && t.handleHeartbeat(rpc) {
		goto wait
	}
	select {
	case t.consumer <- rpc:
	case <-t.ctx.Done():
		return nil, status.Errorf(codes.NotFound, "raft group %q closed on this node", t.group)
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
wait:
	select {
	case r := <-ch:
		if r.Error != nil {
			return nil, status.Errorf(codes.Unknown, "raft group %q: %v", t.group, r.Error)
		}
		t.received(cmd, r.Response)
		return r.Response, nil
	case <-t.ctx.Done():
		return nil, status.Errorf(codes.NotFound, "raft group %q closed on this node", t.group)
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
}

// serveUnary decodes a request of type Req, dispatches it and encodes the answer.
// serveUnary answers one RPC; wait says whether to wait for a group that is
// not open yet (lookupWait), which appends do and heartbeats, answered in
// batches, do not.
func serveUnary[Req any](ctx context.Context, m *Mux, in *transportpb.RPC, wait bool) (*transportpb.RPC, error) {
	if in.Group == "" {
		return nil, status.Error(codes.InvalidArgument, "raft RPC without a group")
	}
	lookup := m.lookup
	if wait {
		lookup = func(g string) (*Transport, error) { return m.lookupWait(ctx, g) }
	}
	t, err := lookup(in.Group)
	if err != nil {
		return nil, err
	}
	req := new(Req)
	if ae, ok := any(req).(*raft.AppendEntriesRequest); ok && len(in.Append) > 0 && !m.cfg.MsgpackAppends {
		if err := decodeAppend(in.Append, ae); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "raft group %q: %v", in.Group, err)
		}
	} else if err := decode(in.Msgpack, req); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	resp, err := t.dispatch(ctx, req, nil)
	if err != nil {
		return nil, err
	}
	out, err := encode(resp)
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	answer := &transportpb.RPC{Group: in.Group, Msgpack: out, TakesAppend: !m.cfg.MsgpackAppends}
	if in.Timing != 0 {
		answer.Timing = t.followTiming(req, resp, in.Timing)
	}
	t.noteRefusedTransfer(req, resp)
	return answer, nil
}

func (s *muxServer) AppendEntries(ctx context.Context, in *transportpb.RPC) (*transportpb.RPC, error) {
	return serveUnary[raft.AppendEntriesRequest](ctx, s.m, in, true)
}

// Votes wait for their group to open, as appends do: the first election
// of a new group (campaignFirst) asks peers that open their replica at
// about the same time, and a refused vote would leave the candidate
// waiting out its election timeout.
func (s *muxServer) RequestVote(ctx context.Context, in *transportpb.RPC) (*transportpb.RPC, error) {
	return serveUnary[raft.RequestVoteRequest](ctx, s.m, in, true)
}

func (s *muxServer) RequestPreVote(ctx context.Context, in *transportpb.RPC) (*transportpb.RPC, error) {
	return serveUnary[raft.RequestPreVoteRequest](ctx, s.m, in, true)
}

func (s *muxServer) TimeoutNow(ctx context.Context, in *transportpb.RPC) (*transportpb.RPC, error) {
	return serveUnary[raft.TimeoutNowRequest](ctx, s.m, in, false)
}
