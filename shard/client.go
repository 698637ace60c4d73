package shard

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/raftps/raftps/replication"
	"github.com/raftps/raftps/replication/chain"
	"github.com/raftps/raftps/shard/shardpb"
	"github.com/raftps/raftps/store"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// ClientConfig configures a Client.
type ClientConfig struct {
	// Addrs are nodes to ask first; the client learns leaders from them.
	Addrs []string
	// ClientID identifies this client's pushes for deduplication; random if 0
	// (the safe choice). An ID must never be reused by another Client
	// instance, at the same time or later (a restarted process included):
	// every Client numbers its pushes from seq 1 again, so the nodes would
	// take the new pushes for retries of the old ones and drop them as
	// duplicates. Push returns ErrClientIDReused when it sees that happen.
	ClientID uint64
	// RetryTimeout bounds how long one Pull or Push keeps retrying through
	// leader changes when the context has no earlier deadline (default 30s).
	RetryTimeout time.Duration
	// AttemptTimeout bounds one call to one node within those retries
	// (default 10s), so a node that stopped answering without closing its
	// connection costs one attempt, not the whole RetryTimeout. A timed-out
	// push is retried with the same seq, so it is still applied at most once.
	AttemptTimeout time.Duration
	// SuspectAfter: a call not answered this long (default 150ms) makes the
	// client ask two other nodes, every SuspectAfter/3 after that, when
	// they last heard from the node it waits for (PeerContact). If one has
	// not for SuspectSilence (default 250ms: a live node is heard from
	// several times per Raft heartbeat interval), the node is taken for
	// dead or cut off and the call is abandoned as if its attempt had timed
	// out, outcome unknown. Without it a client waits out AttemptTimeout on
	// a dead machine, which does not refuse connections. Negative turns the
	// asking off.
	SuspectAfter   time.Duration
	SuspectSilence time.Duration
	// MaxMessageBytes caps a message the client sends or receives (default 64 MiB).
	MaxMessageBytes int
}

// Client talks to a raftps cluster: it routes every key to its shard's
// leader, splits batches by shard and calls shards in parallel, and retries
// through leader changes. Safe for concurrent use.
type Client struct {
	cfg ClientConfig

	mu      sync.Mutex
	conns   map[string]*grpc.ClientConn // by address
	tables  map[string]*shardpb.TableSpec
	maps    map[string]*tableMap // by table: its shards' replicas and epochs
	leaders map[string]string    // group ID -> leader address
	seqs    map[string]*atomic.Uint64
	hot     map[string]*hotView // by table: hot keys and their read replicas
	// specAt: when each table's spec was learnt; a spec older than specTTL
	// is refreshed in the background, so an alter by another client (a new
	// level, hot keys on) reaches this one. specBusy: refresh running.
	specAt   map[string]time.Time
	specBusy map[string]bool
	closed   bool
	// silent: nodes that did not answer an attempt lately (timed out, or the
	// connection failed), by when; retries ask them last.
	silent map[string]time.Time
}

// silentFor is how long a node that did not answer is asked after the
// others. A dead machine does not refuse connections, it just does not
// answer: without this every retry round would first spend an attempt
// timeout on it.
const silentFor = 2 * time.Second

// specTTL is how long a client uses a table's spec before it refreshes it
// in the background.
const specTTL = 5 * time.Second

// NewClient returns a client of the cluster at cfg.Addrs. It connects lazily.
func NewClient(cfg ClientConfig) (*Client, error) {
	if len(cfg.Addrs) == 0 {
		return nil, fmt.Errorf("raftps client: no cluster addresses (--cluster or RAFTPS_CLUSTER)")
	}
	if cfg.ClientID == 0 {
		var b [8]byte
		if _, err := rand.Read(b[:]); err != nil {
			return nil, err
		}
		cfg.ClientID = binary.LittleEndian.Uint64(b[:]) | 1
	}
	if cfg.RetryTimeout == 0 {
		cfg.RetryTimeout = 30 * time.Second
	}
	if cfg.AttemptTimeout == 0 {
		cfg.AttemptTimeout = 10 * time.Second
	}
	if cfg.SuspectAfter == 0 {
		cfg.SuspectAfter = 150 * time.Millisecond
	}
	if cfg.SuspectSilence == 0 {
		cfg.SuspectSilence = 250 * time.Millisecond
	}
	if cfg.MaxMessageBytes == 0 {
		cfg.MaxMessageBytes = DefaultMaxMessageBytes
	}
	return &Client{
		cfg: cfg, conns: map[string]*grpc.ClientConn{}, tables: map[string]*shardpb.TableSpec{},
		maps: map[string]*tableMap{}, leaders: map[string]string{}, seqs: map[string]*atomic.Uint64{},
		hot: map[string]*hotView{}, specAt: map[string]time.Time{}, specBusy: map[string]bool{}, silent: map[string]time.Time{},
	}, nil
}

// ID returns the client's ID.
func (c *Client) ID() uint64 { return c.cfg.ClientID }

// Close closes the client's connections.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	var errs []error
	for _, cc := range c.conns {
		errs = append(errs, cc.Close())
	}
	c.conns = map[string]*grpc.ClientConn{}
	return errors.Join(errs...)
}

func (c *Client) stub(addr string) (shardpb.ParameterServerClient, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, fmt.Errorf("raftps client: %w", ErrClientClosed)
	}
	cc, ok := c.conns[addr]
	if !ok {
		var err error
		cc, err = grpc.NewClient(addr,
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(c.cfg.MaxMessageBytes), grpc.MaxCallSendMsgSize(c.cfg.MaxMessageBytes)))
		if err != nil {
			return nil, fmt.Errorf("raftps client: %s: %w", addr, err)
		}
		c.conns[addr] = cc
	}
	return shardpb.NewParameterServerClient(cc), nil
}

// retryable reports whether an error may go away by asking again, elsewhere
// or later: not a leader, leader not ready, outcome unknown, node down.
func retryable(err error) bool {
	return errors.Is(err, replication.ErrNotLeader) || errors.Is(err, ErrUnavailable) ||
		errors.Is(err, replication.ErrLeaderNotReady) || errors.Is(err, replication.ErrUnknownOutcome) ||
		errors.Is(err, replication.ErrGroupClosed) || errors.Is(err, ErrTooStale) || errors.Is(err, ErrNotHot) || stale(err) ||
		chainRetryable(err)
}

// chainRetryable: a chain replica could not serve yet (reconfiguring,
// catching up, its disk failed) or its tail changed under a read.
func chainRetryable(err error) bool {
	for _, e := range []error{chain.ErrNotTail, chain.ErrStaleEpoch, chain.ErrEpochAhead,
		chain.ErrNotReady, chain.ErrReplicaBroken, chain.ErrUnknownGroup} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// stale reports whether err says the client's map is out of date: a node
// the map no longer places the shard on, or a chain replica no longer in
// its chain's order.
func stale(err error) bool {
	return errors.Is(err, ErrStaleEpoch) || errors.Is(err, ErrNotReplica) || errors.Is(err, chain.ErrNotMember)
}

// tableMap is the client's copy of a table's shard placement.
type tableMap struct {
	shards []*shardpb.ShardMap // by shard; never nil
	addr   map[string]string   // node ID -> gRPC address
}

// replicaAddrs returns the addresses of a shard's replicas, preferred leader
// first, as the client's map has them.
func (c *Client) replicaAddrs(table string, shard uint32) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	tm := c.maps[table]
	if tm == nil || int(shard) >= len(tm.shards) {
		return nil
	}
	var out []string
	for _, id := range tm.shards[shard].Replicas {
		if a := tm.addr[id]; a != "" {
			out = append(out, a)
		}
	}
	return out
}

// epoch returns the client's map epoch of a shard (0: unknown).
func (c *Client) epoch(table string, shard uint32) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if tm := c.maps[table]; tm != nil && int(shard) < len(tm.shards) {
		return tm.shards[shard].Epoch
	}
	return 0
}

// shardRetry is withRetry for one shard of a table: its replicas are the
// first candidates, and an answer that the client's map is stale refreshes
// the map (from the node that said so) before the next attempt.
func (c *Client) shardRetry(ctx context.Context, table string, shard uint32, hint string, fn func(ctx context.Context, addr string) error) error {
	return c.retry(ctx, groupID(table, shard), hint, func() []string { return c.replicaAddrs(table, shard) },
		func(ctx context.Context, addr string) {
			if _, err := c.describeAt(ctx, table, addr); err != nil {
				_, _ = c.Describe(ctx, table)
			}
		}, fn)
}

// maxBackoff caps the pause between retry rounds. A leader election takes a
// few hundred milliseconds (heartbeat timeout plus a vote); a longer pause
// would add most of its length to every failover a client sees.
const maxBackoff = 50 * time.Millisecond

// withRetry calls fn with candidate addresses until it succeeds, fails for
// good, or ctx (bounded by RetryTimeout) ends. hint is tried first; a
// NotLeader answer's leader is tried next. fn must use the context it is
// given, which bounds the attempt by AttemptTimeout as well.
func (c *Client) withRetry(ctx context.Context, group, hint string, fn func(ctx context.Context, addr string) error) error {
	return c.retry(ctx, group, hint, nil, nil, fn)
}

// retry is withRetry with candidates (asked before the configured
// addresses, re-read every round) and refresh (called with the node's
// address when it says the client's map is stale).
func (c *Client) retry(ctx context.Context, group, hint string, candidates func() []string,
	refresh func(ctx context.Context, addr string), fn func(ctx context.Context, addr string) error) error {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.RetryTimeout)
	defer cancel()
	backoff := 5 * time.Millisecond
	next := hint
	redirected := false
	var last error
	for round := 0; ; round++ {
		var addrs []string
		if next != "" {
			addrs = append(addrs, next)
		}
		if candidates != nil {
			addrs = append(addrs, candidates()...)
		}
		addrs = c.order(append(addrs, c.cfg.Addrs...))
		next = ""
		for _, addr := range addrs {
			err := c.attempt(ctx, addr, fn)
			if err == nil {
				if group != "" {
					c.setLeader(group, addr)
				}
				return nil
			}
			err = fromStatus(err)
			if !retryable(err) {
				if ctx.Err() != nil && last != nil && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)) {
					// The time ran out in this attempt: its error says
					// only that, where the one before says why.
					return gaveUp(ctx, round, last)
				}
				return err
			}
			last = err
			if stale(err) && refresh != nil {
				refresh(ctx, addr)
				next = ""
				if candidates != nil {
					if a := candidates(); len(a) > 0 {
						next = a[0]
					}
				}
				break
			}
			var re *RemoteError
			if errors.As(err, &re) && re.LeaderAddr != "" {
				next = re.LeaderAddr
				break
			}
		}
		if ctx.Err() != nil {
			return gaveUp(ctx, round, last)
		}
		// Follow the first redirect at once: usually the leader changed and
		// the hint is right. Every later round backs off, redirect or not: a
		// leader that is not ready yet, with followers pointing at it, would
		// otherwise be asked in a tight loop.
		if next != "" && !redirected {
			redirected = true
			continue
		}
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

// gaveUp is retry's error once ctx ended: the context's error, to match with
// errors.Is, and the last failure, which says why.
func gaveUp(ctx context.Context, round int, last error) error {
	return fmt.Errorf("raftps client: gave up after %d rounds: %w (last error: %v)", round+1, ctx.Err(), last)
}

// attempt is one call of fn to one node, bounded by AttemptTimeout. Running
// out of that time while ctx is still alive is retryable: the node may be
// stopped, or cut off, without the connection noticing.
func (c *Client) attempt(ctx context.Context, addr string, fn func(ctx context.Context, addr string) error) error {
	actx, cancel := c.attemptContext(ctx, addr)
	defer cancel()
	err := fn(actx, addr)
	if err != nil && ctx.Err() == nil {
		if err := c.abandoned(actx, addr, err); err != nil {
			return err
		}
	}
	st, ok := status.FromError(err)
	if ok && st.Code() == codes.Unavailable && strings.Contains(st.Message(), "connection") {
		// The transport's own failure (refused, reset, closing), not a
		// node's answer.
		c.markSilent(addr)
	}
	if ok && st.Code() == codes.Canceled && actx.Err() == nil {
		// Cancelled, but not by this client: the server reset the stream
		// (RST_STREAM CANCEL: it was closing, or, as gRPC servers do, it saw
		// the deadline the attempt sent it pass before this client's clock
		// did; grpc-go turns that into DeadlineExceeded only when the local
		// deadline has passed too, grpc/grpc-go#2211) or the connection
		// went. The outcome is unknown, like a timeout's, and a retry (same
		// sequence number) is safe.
		// Returned as a plain error so fromStatus leaves it retryable.
		return fmt.Errorf("%w: node %s cancelled the call: %v", ErrUnavailable, addr, err)
	}
	return err
}

func (c *Client) isSilent(addr string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	t, ok := c.silent[addr]
	return ok && time.Since(t) < silentFor
}

func (c *Client) markSilent(addr string) {
	c.mu.Lock()
	c.silent[addr] = time.Now()
	c.mu.Unlock()
}

// order drops repeated addresses (the first stays) and moves the nodes
// that did not answer in the last silentFor to the end, keeping the order
// otherwise.
func (c *Client) order(addrs []string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	seen := make(map[string]bool, len(addrs))
	out := make([]string, 0, len(addrs))
	var late []string
	for _, a := range addrs {
		if seen[a] {
			continue
		}
		seen[a] = true
		if t, ok := c.silent[a]; ok && time.Since(t) < silentFor {
			late = append(late, a)
			continue
		}
		delete(c.silent, a)
		out = append(out, a)
	}
	return append(out, late...)
}

func (c *Client) setLeader(group, addr string) {
	c.mu.Lock()
	c.leaders[group] = addr
	c.mu.Unlock()
}

func (c *Client) leader(group string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.leaders[group]
}

// CreateTable creates a table and returns its spec with defaults filled in.
// It returns once the node that created it serves every shard.
//
// An attempt whose outcome is unknown (a timeout, a leader change) is retried;
// if the retry finds the table already there with the spec this call asked
// for, that is this call's table, and CreateTable succeeds.
func (c *Client) CreateTable(ctx context.Context, spec *shardpb.TableSpec) (*shardpb.TableSpec, error) {
	var out *shardpb.TableSpec
	maybeCreated := false // an earlier attempt may have created the table
	err := c.callMeta(ctx, func(ctx context.Context, s shardpb.ParameterServerClient) error {
		resp, err := s.CreateTable(ctx, &shardpb.CreateTableRequest{Spec: spec})
		if err == nil {
			out = resp.Spec
			return nil
		}
		rerr := fromStatus(err)
		if maybeCreated && errors.Is(rerr, store.ErrTableExists) {
			if existing := c.sameTable(ctx, s, spec); existing != nil {
				out = existing
				return nil
			}
		}
		if !errors.Is(rerr, replication.ErrNotLeader) {
			maybeCreated = true
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.tables[out.Name], c.specAt[out.Name] = out, time.Now()
	c.mu.Unlock()
	return out, nil
}

// sameTable returns the stored spec of spec's table if it is the one spec
// asks for (defaults filled in as the nodes fill them), else nil.
func (c *Client) sameTable(ctx context.Context, s shardpb.ParameterServerClient, spec *shardpb.TableSpec) *shardpb.TableSpec {
	want, err := normalizeSpec(spec)
	if err != nil {
		return nil
	}
	d, err := s.DescribeTable(ctx, &shardpb.DescribeTableRequest{Name: spec.Name})
	if err != nil || !proto.Equal(d.Spec, want) {
		return nil
	}
	return d.Spec
}

// callMeta calls fn with a stub of the metadata leader as this client
// knows it (any node will do: a follower forwards or names the leader),
// retrying as withRetry does.
func (c *Client) callMeta(ctx context.Context, fn func(ctx context.Context, s shardpb.ParameterServerClient) error) error {
	return c.withRetry(ctx, metaGroupID, c.leader(metaGroupID), func(ctx context.Context, addr string) error {
		s, err := c.stub(addr)
		if err != nil {
			return err
		}
		return fn(ctx, s)
	})
}

// Describe returns a table's spec, placement and leaders, and refreshes the
// client's caches of them.
func (c *Client) Describe(ctx context.Context, name string) (*shardpb.DescribeTableResponse, error) {
	var out *shardpb.DescribeTableResponse
	err := c.withRetry(ctx, "", "", func(ctx context.Context, addr string) error {
		s, err := c.stub(addr)
		if err != nil {
			return err
		}
		out, err = s.DescribeTable(ctx, &shardpb.DescribeTableRequest{Name: name})
		return err
	})
	if err != nil {
		return nil, err
	}
	c.learn(name, out)
	return out, nil
}

// describeAt is one DescribeTable call to the node at addr, whose answer
// refreshes the caches if its map is not older than the client's.
func (c *Client) describeAt(ctx context.Context, name, addr string) (*shardpb.DescribeTableResponse, error) {
	s, err := c.stub(addr)
	if err != nil {
		return nil, err
	}
	out, err := s.DescribeTable(ctx, &shardpb.DescribeTableRequest{Name: name})
	if err != nil {
		return nil, fromStatus(err)
	}
	c.learn(name, out)
	return out, nil
}

// learn caches a DescribeTable answer: the spec, each shard's entry unless
// the client has a newer one, and the leaders of shards whose entry it took.
func (c *Client) learn(name string, d *shardpb.DescribeTableResponse) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.tables[name], c.specAt[name] = d.Spec, time.Now()
	tm := c.maps[name]
	if tm == nil || len(tm.shards) != len(d.Shards) {
		tm = &tableMap{shards: make([]*shardpb.ShardMap, len(d.Shards)), addr: map[string]string{}}
		c.maps[name] = tm
	}
	for _, nd := range d.Nodes {
		tm.addr[nd.Id] = nd.Addr
	}
	for i, sm := range d.Shards {
		if old := tm.shards[i]; old != nil && old.Epoch > sm.Epoch {
			continue
		}
		if old := tm.shards[i]; old != nil && old.Epoch != sm.Epoch {
			delete(c.leaders, groupID(name, uint32(i)))
		}
		tm.shards[i] = sm
	}
	for _, l := range d.Leaders {
		if l.LeaderAddr != "" && int(l.Shard) < len(tm.shards) && tm.shards[l.Shard].Epoch <= d.Shards[l.Shard].Epoch {
			c.leaders[groupID(name, l.Shard)] = l.LeaderAddr
		}
	}
}

// ListTables returns every table's spec.
func (c *Client) ListTables(ctx context.Context) ([]*shardpb.TableSpec, error) {
	var out []*shardpb.TableSpec
	err := c.withRetry(ctx, "", "", func(ctx context.Context, addr string) error {
		s, err := c.stub(addr)
		if err != nil {
			return err
		}
		resp, err := s.ListTables(ctx, &shardpb.ListTablesRequest{})
		if err == nil {
			out = resp.Tables
		}
		return err
	})
	return out, err
}

// Status asks one node for its status.
func (c *Client) Status(ctx context.Context, addr string) (*shardpb.StatusResponse, error) {
	return c.StatusWith(ctx, addr, &shardpb.StatusRequest{})
}

// StatusWith is Status with options (replica checksums).
func (c *Client) StatusWith(ctx context.Context, addr string, req *shardpb.StatusRequest) (*shardpb.StatusResponse, error) {
	s, err := c.stub(addr)
	if err != nil {
		return nil, err
	}
	resp, err := s.Status(ctx, req)
	if err != nil {
		return nil, fromStatus(err)
	}
	return resp, nil
}

func (c *Client) spec(ctx context.Context, table string) (*shardpb.TableSpec, error) {
	c.mu.Lock()
	s := c.tables[table]
	if s != nil && time.Since(c.specAt[table]) > specTTL {
		c.refreshSpecLocked(table)
	}
	c.mu.Unlock()
	if s != nil {
		return s, nil
	}
	d, err := c.Describe(ctx, table)
	if err != nil {
		return nil, err
	}
	return d.Spec, nil
}

// refreshSpecLocked describes table in the background, unless that is
// already under way; c.mu is held. A failed refresh is tried again after
// specTTL, not at once, so a down metadata service is not hammered.
func (c *Client) refreshSpecLocked(table string) {
	if c.specBusy[table] || c.closed {
		return
	}
	c.specBusy[table] = true
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, _ = c.Describe(ctx, table)
		c.mu.Lock()
		c.specBusy[table] = false
		c.specAt[table] = time.Now()
		c.mu.Unlock()
	}()
}

// split groups the distinct keys of a batch by shard. idx[i] is the position
// of keys[i] among its shard's keys.
type split struct {
	keys [][]uint64 // per shard, distinct
	pos  [][]int    // per shard: for each distinct key, its first batch position
	of   []int      // per batch position: index of its key within its shard's keys
	sh   []uint32   // per batch position: its shard
}

func splitKeys(keys []uint64, shards uint32) *split {
	sp := &split{keys: make([][]uint64, shards), pos: make([][]int, shards), of: make([]int, len(keys)), sh: make([]uint32, len(keys))}
	seen := make(map[uint64]int, len(keys))
	for i, k := range keys {
		s := ShardOf(k, shards)
		sp.sh[i] = s
		if j, ok := seen[k]; ok {
			sp.of[i] = j
			continue
		}
		j := len(sp.keys[s])
		seen[k] = j
		sp.of[i] = j
		sp.keys[s] = append(sp.keys[s], k)
		sp.pos[s] = append(sp.pos[s], i)
	}
	return sp
}

// Pull fills out with the rows of keys (len(keys) × dim values, in the
// order of keys) at the table's consistency level.
func (c *Client) Pull(ctx context.Context, table string, keys []uint64, out []float32) error {
	return c.PullWith(ctx, table, keys, out, shardpb.Consistency_CONSISTENCY_UNSPECIFIED)
}

// PullWith is Pull at an explicit consistency level (at least the table's).
func (c *Client) PullWith(ctx context.Context, table string, keys []uint64, out []float32, level shardpb.Consistency) error {
	return c.PullOpts(ctx, table, keys, out, PullOptions{Level: level})
}

// PullOptions choose the consistency of one pull.
type PullOptions struct {
	// Level: UNSPECIFIED is the table's. A stronger level than the table's
	// is always allowed; a weaker one only with AllowWeaker.
	Level shardpb.Consistency
	// StalenessBound of a BOUNDED pull: tighter than the table's bound, or
	// the bound of a bounded pull of an eventual table (or, with
	// AllowWeaker, of a linearizable one). 0: the table's.
	StalenessBound time.Duration
	// AllowWeaker asks knowingly for less than the table promises.
	AllowWeaker bool
}

// PullOpts is Pull with options. Linearizable pulls go to each shard's
// leader (of a chain table: to any member, spread as below). Bounded and eventual pulls are spread over each shard's replicas,
// and the table's hot keys over their read replicas too; a replica that
// cannot serve within the bound says so, and the part is asked again at
// the shard's replicas, preferred leader first.
func (c *Client) PullOpts(ctx context.Context, table string, keys []uint64, out []float32, o PullOptions) error {
	spec, err := c.spec(ctx, table)
	if err != nil {
		return err
	}
	dim := int(spec.Dim)
	if len(out) != len(keys)*dim {
		return fmt.Errorf("raftps client: pull of %d keys of table %q (dim %d) into %d values", len(keys), table, dim, len(out))
	}
	level := o.Level
	if level == shardpb.Consistency_CONSISTENCY_UNSPECIFIED {
		level = spec.Consistency
	}
	// A chain serves linearizable pulls at any member (CRAQ): spread them.
	if level != shardpb.Consistency_CONSISTENCY_LINEARIZABLE || isChain(spec) || testBreak == breakFollowerLinearizable {
		return c.pullSpread(ctx, spec, keys, out, o, level)
	}
	sp := splitKeys(keys, spec.Shards)
	parts := make([]*shardpb.PullRequest, spec.Shards)
	for s := range parts {
		parts[s] = &shardpb.PullRequest{Table: table, Shard: uint32(s), Keys: KeysBytes(sp.keys[s]), Consistency: o.Level, Epoch: c.epoch(table, uint32(s)),
			StalenessBoundNs: int64(o.StalenessBound), AllowWeaker: o.AllowWeaker}
	}
	// Each shard's answer stays as wire bytes; rows are copied from them
	// straight into out, once, below.
	rows := make([][]byte, spec.Shards)
	checkRows := func(addr string, s uint32, values []byte) error {
		if len(values) != len(sp.keys[s])*dim*4 {
			return fmt.Errorf("raftps client: %s answered %d bytes for %d keys of dim %d", addr, len(values), len(sp.keys[s]), dim)
		}
		rows[s] = values
		return nil
	}
	batch := func(ctx context.Context, addr string, st shardpb.ParameterServerClient, shards []uint32) ([]partResult, error) {
		resp, err := st.PullBatch(ctx, &shardpb.PullBatchRequest{Parts: pick(parts, shards)})
		if err != nil {
			return nil, err
		}
		if err := checkAnswers(addr, len(shards), len(resp.Parts), len(resp.Errors)); err != nil {
			return nil, err
		}
		res := make([]partResult, len(shards))
		for i, s := range shards {
			if res[i] = retryPart(addr, resp.Errors[i]); res[i].err == nil {
				if err := checkRows(addr, s, resp.Parts[i].Values); err != nil {
					res[i] = partResult{err: err}
				}
			}
		}
		return res, nil
	}
	single := func(s uint32, hint string) error {
		return c.shardRetry(ctx, table, s, hint, func(ctx context.Context, addr string) error {
			st, err := c.stub(addr)
			if err != nil {
				return err
			}
			parts[s].Epoch = c.epoch(table, s)
			resp, err := st.Pull(ctx, parts[s])
			if err != nil {
				return err
			}
			return checkRows(addr, s, resp.Values)
		})
	}
	if err := c.fanOut(ctx, table, sp, batch, single, nil); err != nil {
		return fmt.Errorf("pull from table %q: %w", table, err)
	}
	outBytes, rowBytes := ValuesBytes(out), dim*4
	for i := range keys {
		s, j := sp.sh[i], sp.of[i]
		copy(outBytes[i*rowBytes:(i+1)*rowBytes], rows[s][j*rowBytes:(j+1)*rowBytes])
	}
	return nil
}

// Push sends gradients (len(keys) × dim values) to the table. Gradients of a
// key that occurs more than once are summed first. Each shard's part is
// applied exactly once, however often it is retried; Push returns once every
// part is applied. On an error some parts may have been applied.
func (c *Client) Push(ctx context.Context, table string, keys []uint64, grads []float32) error {
	spec, err := c.spec(ctx, table)
	if err != nil {
		return err
	}
	dim := int(spec.Dim)
	if len(grads) != len(keys)*dim {
		return fmt.Errorf("raftps client: push of %d keys to table %q (dim %d) with %d values", len(keys), table, dim, len(grads))
	}
	sp := splitKeys(keys, spec.Shards)
	sums := make([][]float32, spec.Shards)
	for s := range sums {
		sums[s] = make([]float32, len(sp.keys[s])*dim)
	}
	for i := range keys {
		s, j := sp.sh[i], sp.of[i]
		dst, src := sums[s][j*dim:(j+1)*dim], grads[i*dim:(i+1)*dim]
		for c := range dst {
			dst[c] += src[c]
		}
	}
	// Every attempt at a shard, batched or not, sends the same request, so
	// a retry carries the same seq and is applied at most once.
	parts := make([]*shardpb.PushRequest, spec.Shards)
	for s := range parts {
		if len(sp.keys[s]) > 0 {
			parts[s] = &shardpb.PushRequest{Table: table, Shard: uint32(s), ClientId: c.cfg.ClientID, Seq: c.nextSeq(groupID(table, uint32(s))),
				Keys: KeysBytes(sp.keys[s]), Grads: ValuesBytes(sums[s]), Epoch: c.epoch(table, uint32(s))}
		}
	}
	// sent[s]: an earlier attempt may have reached a leader's log. Only a
	// NotLeader refusal proves it did not; until one may have, the seq is
	// new to the cluster, and "duplicate" means another Client uses this
	// ClientID. Each shard's entry is used by one goroutine at a time.
	sent := make([]bool, spec.Shards)
	duplicate := func(addr string, s uint32, dup bool) error {
		if dup && !sent[s] {
			req := parts[s]
			return fmt.Errorf("%w: %s answered that push seq %d of client %d was applied before, but this Client never sent it: another Client uses ClientID %d", ErrClientIDReused, addr, req.Seq, req.ClientId, req.ClientId)
		}
		return nil
	}
	batch := func(ctx context.Context, addr string, st shardpb.ParameterServerClient, shards []uint32) ([]partResult, error) {
		resp, err := st.PushBatch(ctx, &shardpb.PushBatchRequest{Parts: pick(parts, shards)})
		if err != nil {
			return nil, err
		}
		if err := checkAnswers(addr, len(shards), len(resp.Parts), len(resp.Errors)); err != nil {
			return nil, err
		}
		res := make([]partResult, len(shards))
		for i, s := range shards {
			res[i] = retryPart(addr, resp.Errors[i])
			if res[i].err == nil {
				if err := duplicate(addr, s, resp.Parts[i].Duplicate); err != nil {
					res[i] = partResult{err: err}
				}
			}
			if res[i].err == nil || !(errors.Is(res[i].err, replication.ErrNotLeader) || stale(res[i].err)) {
				sent[s] = true
			}
		}
		return res, nil
	}
	single := func(s uint32, hint string) error {
		return c.shardRetry(ctx, table, s, hint, func(ctx context.Context, addr string) error {
			st, err := c.stub(addr)
			if err != nil {
				return err
			}
			parts[s].Epoch = c.epoch(table, s)
			resp, err := st.Push(ctx, parts[s])
			if err != nil {
				if rerr := fromStatus(err); !errors.Is(rerr, replication.ErrNotLeader) && !stale(rerr) {
					sent[s] = true
				}
				return err
			}
			return duplicate(addr, s, resp.Duplicate)
		})
	}
	// A batch call that failed as a whole may have reached the node.
	failed := func(shards []uint32) {
		for _, s := range shards {
			sent[s] = true
		}
	}
	if err := c.fanOut(ctx, table, sp, batch, single, failed); err != nil {
		return fmt.Errorf("push to table %q: %w", table, err)
	}
	return nil
}

// pick returns the parts of shards, in that order.
func pick[P any](parts []P, shards []uint32) []P {
	out := make([]P, len(shards))
	for i, s := range shards {
		out[i] = parts[s]
	}
	return out
}

// checkAnswers checks that a batch answer has a response and an error entry
// for each of its n parts.
func checkAnswers(addr string, n, responses, errs int) error {
	if responses != n || errs != n {
		return fmt.Errorf("raftps client: %s answered %d parts and %d errors for %d parts", addr, responses, errs, n)
	}
	return nil
}

// partResult is what a batch call said of one shard's part: done (err nil),
// failed for good, or worth retrying on the per-shard path, starting at hint.
type partResult struct {
	err   error
	retry bool
	hint  string
}

// retryPart reads a batch answer's error for one part. Every failure is
// retried on the per-shard path, which gives up at once on one that is not
// retryable: an error costs one more call, and the rules stay in withRetry.
func retryPart(addr string, pe *shardpb.PartError) partResult {
	if pe.GetCode() == 0 {
		return partResult{}
	}
	st := status.New(codes.Code(pe.Code), pe.Message)
	if pe.LeaderAddr != "" {
		st, _ = st.WithDetails(&shardpb.NotLeader{LeaderAddr: pe.LeaderAddr})
	}
	hint := pe.LeaderAddr
	if hint == "" {
		hint = addr
	}
	return partResult{err: fromStatus(st.Err()), retry: true, hint: hint}
}

// fanOut sends the shards' parts of one Pull or Push: one batch call to each
// node the client believes leads some of them, so a batch costs a round trip
// per node rather than per shard. A part the batch did not complete (its node
// no longer leads the shard, the call failed, no leader is known) goes
// through the per-shard path, single, which retries through leader changes.
// failed, if set, learns the shards of a batch call that failed as a whole.
func (c *Client) fanOut(ctx context.Context, table string, sp *split,
	batch func(ctx context.Context, addr string, st shardpb.ParameterServerClient, shards []uint32) ([]partResult, error),
	single func(s uint32, hint string) error, failed func(shards []uint32)) error {
	byNode := map[string][]uint32{}
	var unknown []uint32
	for s := range sp.keys {
		if len(sp.keys[s]) == 0 {
			continue
		}
		addr := c.leader(groupID(table, uint32(s)))
		if addr == "" {
			if r := c.replicaAddrs(table, uint32(s)); len(r) > 0 {
				addr = r[0]
			}
		}
		if addr != "" && !c.isSilent(addr) {
			byNode[addr] = append(byNode[addr], uint32(s))
		} else {
			// No leader known, or it did not answer lately: the per-shard
			// path asks the others first.
			unknown = append(unknown, uint32(s))
		}
	}
	errs := make([]error, len(sp.keys))
	var wg sync.WaitGroup
	for _, s := range unknown {
		wg.Go(func() { errs[s] = single(s, "") })
	}
	for addr, shards := range byNode {
		wg.Go(func() {
			res, err := c.batchAttempt(ctx, addr, shards, batch)
			if err != nil && failed != nil {
				failed(shards)
			}
			for i, s := range shards {
				switch {
				case err != nil:
					// Another node may know better; start from the list.
					wg.Go(func() { errs[s] = single(s, "") })
				case res[i].retry:
					wg.Go(func() { errs[s] = single(s, res[i].hint) })
				default:
					errs[s] = res[i].err
				}
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// batchAttempt is one batch call to one node, bounded by AttemptTimeout.
func (c *Client) batchAttempt(ctx context.Context, addr string, shards []uint32,
	batch func(ctx context.Context, addr string, st shardpb.ParameterServerClient, shards []uint32) ([]partResult, error)) ([]partResult, error) {
	st, err := c.stub(addr)
	if err != nil {
		return nil, err
	}
	actx, cancel := c.attemptContext(ctx, addr)
	defer cancel()
	res, err := batch(actx, addr, st, shards)
	if err != nil && ctx.Err() == nil {
		if aerr := c.abandoned(actx, addr, err); aerr != nil {
			return nil, aerr
		}
	}
	return res, err
}

func (c *Client) nextSeq(group string) uint64 {
	c.mu.Lock()
	s, ok := c.seqs[group]
	if !ok {
		s = new(atomic.Uint64)
		c.seqs[group] = s
	}
	c.mu.Unlock()
	return s.Add(1)
}

// ClusterMap returns the cluster map as the metadata leader has it.
func (c *Client) ClusterMap(ctx context.Context) (*shardpb.ClusterMap, error) {
	var out *shardpb.ClusterMap
	err := c.callMeta(ctx, func(ctx context.Context, s shardpb.ParameterServerClient) error {
		var err error
		out, err = s.GetClusterMap(ctx, &shardpb.GetClusterMapRequest{})
		return err
	})
	return out, err
}

// SetNodeAdmin drains (NODE_DRAINING), removes (NODE_REMOVED) or reactivates
// (NODE_ACTIVE) a node. Draining moves every replica and leadership off the
// node, at the scheduler's pace; removing forgets a node that is not alive.
// Both are refused if the other active nodes cannot hold every table's
// replicas.
func (c *Client) SetNodeAdmin(ctx context.Context, id string, admin shardpb.NodeAdmin) error {
	return c.callMeta(ctx, func(ctx context.Context, s shardpb.ParameterServerClient) error {
		_, err := s.SetNodeAdmin(ctx, &shardpb.SetNodeAdminRequest{Id: id, Admin: admin})
		return err
	})
}
