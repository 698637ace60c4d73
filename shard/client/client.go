package client

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/raftps/raftps/shard/api"
	"github.com/raftps/raftps/shard/grpcopt"
	"github.com/raftps/raftps/shard/shardpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
)

// Client talks to a raftps cluster: it routes every key to its shard's
// replicas, splits batches by shard and calls nodes in parallel, and retries
// through leader changes with the same (client, seq), so a push is applied
// exactly once. Safe for concurrent use.
type Client struct {
	cfg     Config
	metrics *clientMetrics // nil without Config.Metrics

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
	// connection failed); retries ask them last. Its own lock.
	silent marks

	hedge hedgeState // hedge.go
}

// silentFor is how long a node that did not answer is asked after the
// others. A dead machine does not refuse connections, it just does not
// answer: without this every retry round would first spend an attempt
// timeout on it.
const silentFor = 2 * time.Second

// specTTL is how long a client uses a table's spec before it refreshes it
// in the background.
const specTTL = 5 * time.Second

// New returns a client of the cluster at cfg.Addrs. It connects lazily: a
// cluster that is down makes the first call fail, not New.
func New(cfg Config) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.Addrs = append([]string(nil), cfg.Addrs...)
	if cfg.ClientID == 0 {
		var b [8]byte
		if _, err := rand.Read(b[:]); err != nil {
			return nil, fmt.Errorf("raftps client: drawing a client ID: %w", err)
		}
		cfg.ClientID = binary.LittleEndian.Uint64(b[:]) | 1
	}
	var m *clientMetrics
	if cfg.Metrics != nil {
		var err error
		if m, err = newClientMetrics(cfg.Metrics); err != nil {
			return nil, fmt.Errorf("raftps client: registering metrics: %w", err)
		}
	}
	return &Client{metrics: m,
		cfg: cfg, conns: map[string]*grpc.ClientConn{}, tables: map[string]*shardpb.TableSpec{},
		maps: map[string]*tableMap{}, leaders: map[string]string{}, seqs: map[string]*atomic.Uint64{},
		hot: map[string]*hotView{}, specAt: map[string]time.Time{}, specBusy: map[string]bool{}, silent: marks{ttl: silentFor}, hedge: hedgeState{slow: marks{ttl: slowFor}},
	}, nil
}

// ID returns the client's ID, the first half of every push's (client, seq).
func (c *Client) ID() uint64 { return c.cfg.ClientID }

// Addrs returns the addresses the client was configured with.
func (c *Client) Addrs() []string { return append([]string(nil), c.cfg.Addrs...) }

// Close closes the client's connections. Calls after Close fail with
// ErrClientClosed.
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

// Raw returns a stub of the client API of the node at addr over the
// client's connection to it: the escape hatch to calls and fields this
// package does not wrap. Its errors are gRPC statuses; api.FromStatus
// turns them into the errors of this package.
func (c *Client) Raw(addr string) (shardpb.ParameterServerClient, error) { return c.stub(addr) }

func (c *Client) stub(addr string) (shardpb.ParameterServerClient, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, fmt.Errorf("raftps client: %w", ErrClientClosed)
	}
	cc, ok := c.conns[addr]
	if !ok {
		opts := append([]grpc.DialOption{
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(c.cfg.MaxMessageBytes), grpc.MaxCallSendMsgSize(c.cfg.MaxMessageBytes)),
			redial,
		}, append(grpcopt.Dial(), c.cfg.DialOptions...)...)
		var err error
		if cc, err = grpc.NewClient(addr, opts...); err != nil {
			return nil, fmt.Errorf("raftps client: %s: %w", addr, err)
		}
		c.conns[addr] = cc
	}
	return shardpb.NewParameterServerClient(cc), nil
}

// redial makes a connection to a node that is down try again within a
// second, as the nodes do among themselves. gRPC's default backoff (1 s,
// growing by 1.6 to 2 minutes) suits a remote service that is rarely
// down; a node of the cluster restarts in seconds and may lead shards at
// once (the preferred leader gets them back), and while the connection
// waits out its backoff every call to it fails fast, so pushes to its
// shards stalled for as long (TestClientRedialsARestartedNode: 6 s after a
// 10 s outage). DialOptions may override it.
var redial = grpc.WithConnectParams(grpc.ConnectParams{MinConnectTimeout: 2 * time.Second,
	Backoff: backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second}})

// tableMap is the client's copy of a table's shard placement.
type tableMap struct {
	shards []*shardpb.ShardMap // by shard; never nil
	addr   map[string]string   // node ID -> client address
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

// shardRetry is retry for one shard of a table: its replicas are the first
// candidates, and an answer that the client's map is stale refreshes the
// map (from the node that said so) before the next attempt.
func (c *Client) shardRetry(ctx context.Context, table string, shard uint32, hint string, fn func(ctx context.Context, addr string) error) error {
	return c.retry(ctx, api.GroupID(table, shard), hint, func() []string { return c.replicaAddrs(table, shard) },
		func(ctx context.Context, addr string) {
			if _, err := c.describeAt(ctx, table, addr); err != nil {
				_, _ = c.describe(ctx, table)
			}
		}, fn)
}

// maxBackoff caps the pause between retry rounds. A leader election takes a
// few hundred milliseconds (heartbeat timeout plus a vote); a longer pause
// would add most of its length to every failover a client sees.
const maxBackoff = 50 * time.Millisecond

// retry calls fn with candidate addresses until it succeeds, fails for
// good, or ctx (bounded by RetryTimeout) ends. hint is tried first; a
// NotLeader answer's leader is tried next; then candidates (re-read every
// round, if set), then the configured addresses. refresh, if set, is called
// with the node's address when it says the client's map is stale. fn must
// use the context it is given, which bounds the attempt by AttemptTimeout
// as well. A success through a group ("" for none) makes the node its
// known leader.
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
		addrs = c.askable(c.order(append(addrs, c.cfg.Addrs...)))
		if next != "" && !c.isSilent(next) && len(addrs) > 0 && addrs[0] != next {
			// The hint or a redirect names the node to ask first, even
			// if a hedge beat it on a read lately: that says nothing of
			// where a write must go, and behind the candidates it was
			// never asked, since the first one's NotLeader answer ends
			// the round (pushes stalled until the mark expired, 2 s).
			addrs = append([]string{next}, slices.DeleteFunc(addrs, func(a string) bool { return a == next })...)
		}
		next = ""
		for _, addr := range addrs {
			err := c.attempt(ctx, addr, fn)
			if err == nil {
				if group != "" {
					c.setLeader(group, addr)
				}
				return nil
			}
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
				c.leaderNamed(next)
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

// attempt is one call of fn to one node, bounded by AttemptTimeout (and by
// what the node's peers say of it: attemptContext). Its error is already
// converted from the gRPC status. Running out of that time while ctx is
// still alive is retryable: the node may be stopped, or cut off, without
// the connection noticing.
func (c *Client) attempt(ctx context.Context, addr string, fn func(ctx context.Context, addr string) error) error {
	actx, cancel := c.attemptContext(ctx, addr)
	defer cancel()
	return c.callFailed(ctx, actx, addr, fn(actx, addr))
}

// callFailed classifies the error of one call to addr made with the
// attempt context actx inside the caller's ctx: converted from its status,
// and, when the node did not answer, a retryable ErrUnavailable (outcome
// unknown) with addr marked silent.
func (c *Client) callFailed(ctx, actx context.Context, addr string, err error) error {
	if err == nil {
		return nil
	}
	if ctx.Err() == nil {
		if aerr := c.abandoned(actx, addr, err); aerr != nil {
			return aerr
		}
	}
	rerr := api.FromStatus(err)
	var re *RemoteError
	if !errors.As(rerr, &re) {
		return rerr
	}
	switch {
	case re.Reason == "" && re.Code == codes.Unavailable:
		// The transport's own failure (refused, reset, closing): a node's
		// answer always carries a reason. Redial at once rather than after
		// the backoff: a node back from a restart is asked again as soon
		// as its peers name it (leaderNamed).
		c.markSilent(addr)
		c.redialNow(addr)
	case re.Reason == "" && re.Code == codes.Canceled && actx.Err() == nil:
		// Cancelled, but not by this client: the server reset the stream
		// (RST_STREAM CANCEL: it was closing, or, as gRPC servers do, it saw
		// the deadline the attempt sent it pass before this client's clock
		// did; grpc-go turns that into DeadlineExceeded only when the local
		// deadline has passed too, grpc/grpc-go#2211) or the connection
		// went. The outcome is unknown, like a timeout's, and a retry (same
		// sequence number) is safe.
		return fmt.Errorf("%w: node %s cancelled the call: %v", ErrUnavailable, addr, err)
	}
	return rerr
}

func (c *Client) isSilent(addr string) bool { return c.silent.has(addr) }
func (c *Client) markSilent(addr string)    { c.silent.mark(addr) }

// leaderNewsAfter is how long after a node was marked silent a node that
// answered naming it as a leader counts as news that it is up: longer
// than its peers take to elect another leader if it died or froze
// (expedited elections: 200-400 ms), during which they still name it.
const leaderNewsAfter = 500 * time.Millisecond

// leaderNamed takes a node that answered naming addr as a group's leader
// for news that addr is up, once addr has been marked silent for
// leaderNewsAfter: raft learns its leader from that leader's own appends,
// and its peers would have elected another by then. The mark goes, and
// the connection redials now. Marked, addr was left out of every round
// until the mark expired: writes to the shards a node led again after a
// restart stalled for the 2 s of silentFor (TestClientRedialsARestartedNode).
func (c *Client) leaderNamed(addr string) {
	if !c.silent.markedFor(addr, leaderNewsAfter) {
		return
	}
	c.silent.unmark(addr)
	c.redialNow(addr)
}

// redialNow makes the connection to addr, if it waits out a reconnect
// backoff, try again at once.
func (c *Client) redialNow(addr string) {
	c.mu.Lock()
	cc := c.conns[addr]
	c.mu.Unlock()
	if cc != nil {
		cc.ResetConnectBackoff()
	}
}

// order drops repeated addresses (the first stays) and moves the nodes a
// hedge beat lately, then those that did not answer in the last silentFor,
// to the end, keeping the order otherwise.
func (c *Client) order(addrs []string) []string {
	seen := make(map[string]bool, len(addrs))
	out := make([]string, 0, len(addrs))
	var slow, silent []string
	for _, a := range addrs {
		if seen[a] {
			continue
		}
		seen[a] = true
		switch {
		case c.isSilent(a):
			silent = append(silent, a)
		case c.isSlow(a):
			slow = append(slow, a)
		default:
			out = append(out, a)
		}
	}
	return append(append(out, slow...), silent...)
}

// askable drops from ordered addresses the nodes that did not answer
// lately, unless they are all there is: a round of retries then costs no
// attempt on a node that is likely dead or frozen (each waits out the
// suspicion of its peers), and a node comes back into rounds once its
// silent mark expires.
func (c *Client) askable(addrs []string) []string {
	for i, a := range addrs {
		if c.isSilent(a) {
			if i == 0 {
				return addrs
			}
			return addrs[:i]
		}
	}
	return addrs
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

// callMeta calls fn with a stub of the metadata leader as this client
// knows it (any node will do: a follower forwards or names the leader),
// retrying as retry does.
func (c *Client) callMeta(ctx context.Context, fn func(ctx context.Context, s shardpb.ParameterServerClient) error) error {
	return c.anyNode(ctx, api.MetaGroupID, c.leader(api.MetaGroupID), fn)
}

// anyNode calls fn at any node that answers, starting at hint, retrying as
// retry does.
func (c *Client) anyNode(ctx context.Context, group, hint string, fn func(ctx context.Context, s shardpb.ParameterServerClient) error) error {
	return c.retry(ctx, group, hint, nil, nil, func(ctx context.Context, addr string) error {
		s, err := c.stub(addr)
		if err != nil {
			return err
		}
		return fn(ctx, s)
	})
}

// spec returns table's spec, from the cache (refreshed in the background
// once older than specTTL) or asked for.
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
	d, err := c.describe(ctx, table)
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
		_, _ = c.describe(ctx, table)
		c.mu.Lock()
		c.specBusy[table] = false
		c.specAt[table] = time.Now()
		c.mu.Unlock()
	}()
}

// describe asks any node for a table's spec, placement and leaders, and
// refreshes the client's caches of them.
func (c *Client) describe(ctx context.Context, name string) (*shardpb.DescribeTableResponse, error) {
	var out *shardpb.DescribeTableResponse
	err := c.anyNode(ctx, "", "", func(ctx context.Context, s shardpb.ParameterServerClient) (err error) {
		out, err = s.DescribeTable(ctx, &shardpb.DescribeTableRequest{Name: name})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("describing table %q: %w", name, err)
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
		return nil, api.FromStatus(err)
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
			delete(c.leaders, api.GroupID(name, uint32(i)))
		}
		tm.shards[i] = sm
	}
	for _, l := range d.Leaders {
		if l.LeaderAddr != "" && int(l.Shard) < len(tm.shards) && tm.shards[l.Shard].Epoch <= d.Shards[l.Shard].Epoch {
			c.leaders[api.GroupID(name, l.Shard)] = l.LeaderAddr
		}
	}
}

// setSpec caches a table's spec that a create or alter returned, and drops
// what depends on the old one.
func (c *Client) setSpec(spec *shardpb.TableSpec) {
	c.mu.Lock()
	c.tables[spec.Name], c.specAt[spec.Name] = spec, time.Now()
	delete(c.hot, spec.Name)
	c.mu.Unlock()
}

// forgetTable drops what the client caches of a table (spec, map, hot
// keys, leaders), so that a table created again under the name is learned
// afresh.
func (c *Client) forgetTable(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.tables, name)
	delete(c.specAt, name)
	delete(c.maps, name)
	delete(c.hot, name)
	for g := range c.leaders {
		if t, _, ok := strings.Cut(g, "/"); ok && t == name {
			delete(c.leaders, g)
		}
	}
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
