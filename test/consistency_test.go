package test

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/raftps/raftps/shard"
	"github.com/raftps/raftps/shard/api"
	"github.com/raftps/raftps/shard/client"
	"github.com/raftps/raftps/shard/shardpb"
)

// firstValue is the first value of a Pull's answer, or its error.
func firstValue(resp *shardpb.PullResponse, err error) (float32, error) {
	if err != nil {
		return 0, err
	}
	v, err := api.DecodeValues(resp.Values, nil)
	if err != nil {
		return 0, err
	}
	if len(v) == 0 {
		return 0, errors.New("pull answered no values")
	}
	return v[0], nil
}

// served sums the cluster's served-pull counters of one role and level.
func served(c *Cluster, role, level string) (requests, refused uint64) {
	for i := range c.Len() {
		n := c.Node(i)
		if n == nil {
			continue
		}
		for _, s := range n.Served() {
			if s.Role == role && s.Level == level {
				requests += s.Requests
				refused += s.Refused
			}
		}
	}
	return requests, refused
}

func levelSpec(name string, level client.Level, bound time.Duration) client.TableSpec {
	spec := counterSpec(name, 4)
	spec.Shards = 2
	spec.Consistency = client.Consistency{Level: level, Bound: bound}
	return spec
}

// TestConsistencyLevelsServedWhere checks, from the nodes' served-pull
// counters, that linearizable pulls are served by leaders only and bounded
// and eventual pulls by followers too; that every bounded pull reflects the
// pushes acknowledged more than its bound before it began; and that a
// weaker level than the table's is refused unless asked for knowingly.
func TestConsistencyLevelsServedWhere(t *testing.T) {
	c := StartCluster(t, 3, FastRaft())
	cl := c.Client()
	ctx := context.Background()
	const bound = 100 * time.Millisecond
	tables := []struct {
		name  string
		level client.Level
		bound time.Duration
	}{
		{"lin", client.Linearizable, 0},
		{"bnd", client.Bounded, bound},
		{"evt", client.Eventual, 0},
	}
	keys := []uint64{1, 2, 3, 4, 5, 6, 7, 8}
	out := make([]float32, len(keys)*4)
	for _, tb := range tables {
		if _, err := cl.Tables().Create(ctx, levelSpec(tb.name, tb.level, tb.bound)); err != nil {
			t.Fatal(err)
		}
		for range 60 {
			if err := cl.Pull(ctx, tb.name, keys, out); err != nil {
				t.Fatalf("%s: %v", tb.name, err)
			}
		}
	}
	if r, _ := served(c, "follower", "linearizable"); r != 0 {
		t.Errorf("followers served %d linearizable pulls; only leaders may", r)
	}
	if r, _ := served(c, "leader", "linearizable"); r < 60 {
		t.Errorf("leaders served %d linearizable pulls, want at least 60", r)
	}
	for _, level := range []string{"bounded", "eventual"} {
		if r, _ := served(c, "follower", level); r == 0 {
			t.Errorf("no %s pull was served by a follower: reads are not spread", level)
		}
	}

	// Staleness: a bounded pull that begins more than the bound after a
	// push was acknowledged reflects it, wherever it is served.
	grad := make([]float32, 4)
	for i := range 40 {
		key := []uint64{uint64(100 + i%4)}
		grad[0] = 1
		if err := cl.Push(ctx, "bnd", key, grad); err != nil {
			t.Fatal(err)
		}
		want := float32(-(i/4 + 1))
		time.Sleep(bound + bound/10)
		row := make([]float32, 4)
		if err := cl.Pull(ctx, "bnd", key, row); err != nil {
			t.Fatal(err)
		}
		if row[0] != want {
			t.Fatalf("push %d: bounded pull %s after the ack read %v, want %v", i, bound+bound/10, row[0], want)
		}
	}

	// Weaker than the table: refused, unless asked for knowingly.
	err := cl.Pull(ctx, "lin", keys, out, client.WithConsistency(client.Eventual))
	if !errors.Is(err, client.ErrWeakerConsistency) {
		t.Errorf("eventual pull of a linearizable table: %v, want ErrWeakerConsistency", err)
	}
	if err := cl.Pull(ctx, "lin", keys, out, client.WithConsistency(client.Eventual), client.AllowWeaker()); err != nil {
		t.Errorf("eventual pull of a linearizable table with AllowWeaker: %v", err)
	}
	err = cl.Pull(ctx, "bnd", keys, out, client.WithConsistency(client.Bounded), client.WithStaleness(time.Second))
	if !errors.Is(err, client.ErrWeakerConsistency) && err != nil {
		t.Errorf("looser bound: %v", err)
	}
	// Stronger is always allowed, and served by leaders.
	before, _ := served(c, "follower", "linearizable")
	for range 10 {
		if err := cl.Pull(ctx, "evt", keys, out, client.WithConsistency(client.Linearizable)); err != nil {
			t.Fatal(err)
		}
	}
	if after, _ := served(c, "follower", "linearizable"); after != before {
		t.Errorf("linearizable pulls of an eventual table reached followers (%d)", after-before)
	}

	// Alter: bnd becomes linearizable; then no follower serves it.
	spec, err := cl.Tables().Alter(ctx, "bnd", client.SetConsistency(client.Consistency{Level: client.Linearizable}))
	if err != nil {
		t.Fatal(err)
	}
	if spec.Consistency.Level != client.Linearizable || spec.Consistency.Bound != 0 {
		t.Fatalf("altered spec %+v", spec)
	}
	if _, err := cl.Tables().Alter(ctx, "bnd", client.SetConsistency(client.Consistency{Level: client.Bounded})); err == nil {
		t.Error("altering to bounded without a bound succeeded")
	}
	if _, err := cl.Tables().Alter(ctx, "nope", client.SetConsistency(client.Consistency{Level: client.Eventual})); err == nil {
		t.Error("altering an unknown table succeeded")
	}

	// One hot-key setting alone keeps the table's other one.
	if spec, err = cl.Tables().Alter(ctx, "bnd", client.SetHotThreshold(800)); err != nil || spec.HotThreshold != 800 {
		t.Fatalf("hot threshold alone: %+v, %v", spec, err)
	}
	if spec, err = cl.Tables().Alter(ctx, "bnd", client.SetHotReplicas(1)); err != nil || spec.HotThreshold != 800 || spec.HotReplicas != 1 {
		t.Fatalf("hot replicas alone: %+v, %v (want threshold 800 kept)", spec, err)
	}
	if spec, err = cl.Tables().Alter(ctx, "bnd", client.SetHotThreshold(0)); err != nil || spec.HotThreshold != 0 || spec.HotReplicas != 0 {
		t.Fatalf("hot threshold 0: %+v, %v (want hot keys off)", spec, err)
	}
	if _, err := cl.Tables().Alter(ctx, "bnd", client.SetHotReplicas(2)); !errors.Is(err, client.ErrBadRequest) {
		t.Errorf("hot replicas of a table with hot keys off: %v, want ErrBadRequest", err)
	}
}

// TestHotKeysGetReadReplicas pulls one key of a bounded table far more than
// the others, and checks that it becomes hot, gets read replicas on the two
// nodes outside its shard's replica set, that those serve it, and that what
// they serve stays within the bound.
func TestHotKeysGetReadReplicas(t *testing.T) { testHotKeys(t, client.Raft) }

// TestHotKeysGetReadReplicasChain is TestHotKeysGetReadReplicas on a chain
// table: the head decides the hot set and the read replicas copy the rows
// by CRAQ reads.
func TestHotKeysGetReadReplicasChain(t *testing.T) { testHotKeys(t, client.Chain) }

func testHotKeys(t *testing.T, replication client.Replication) {
	c, cl := hotCluster(t, replication, nil)
	ctx := context.Background()
	hot, _ := waitHot(t, c, cl, "hot", 42, 2, -1)
	// Read replicas serve it, and what they serve honours the bound.
	pushes := checkHotPulls(t, c, cl, 0)
	r, refused := served(c, "read-replica", "bounded")
	t.Logf("read replicas served %d pulls (%d refused), %d pushes checked", r, refused, pushes)

	// Hot keys off: the leader releases its read replicas at its next
	// window, well before their assignment would expire on its own.
	if _, err := cl.Tables().Alter(ctx, "hot", client.SetHotKeys(0, 0)); err != nil {
		t.Fatal(err)
	}
	shard := hot.Shard
	released := time.Now().Add(3 * time.Second)
	for {
		holding := 0
		for i := range c.Len() {
			if c.Node(i).ReadReplicates("hot", shard) {
				holding++
			}
		}
		if holding == 0 {
			break
		}
		if time.Now().After(released) {
			t.Fatalf("%d read replicas still hold hot rows 3 s after hot keys were turned off", holding)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// hotBound is the staleness bound of hotCluster's table.
const hotBound = 100 * time.Millisecond

// hotCluster starts 5 nodes (their configs passed through tune, if not
// nil) and creates table "hot" on them: bounded by hotBound, 2 shards of 3
// replicas (so 2 nodes lie outside each replica set), hot at 50 pulls/s
// with 2 read replicas, replicated as replication.
func hotCluster(t *testing.T, replication client.Replication, tune func(*shard.NodeConfig)) (*Cluster, *client.Client) {
	c := StartClusterWith(t, 5, FastRaft(), tune)
	cl := c.Client()
	spec := levelSpec("hot", client.Bounded, hotBound)
	spec.HotThreshold, spec.HotReplicas, spec.Replication = 50, 2, replication
	if _, err := cl.Tables().Create(context.Background(), spec); err != nil {
		t.Fatal(err)
	}
	return c, cl
}

// checkHotPulls pushes a gradient of -1 to key 42 of table "hot" (which
// has had pushes so far), waits out the bound and pulls the key 20 times,
// each of which must see every push; round after round until read replicas
// have served 20 more bounded pulls than when it began, over at least 5
// rounds. It fails the test after 15 s, and returns the pushes made in all.
func checkHotPulls(t *testing.T, c *Cluster, cl *client.Client, pushes int) int {
	t.Helper()
	ctx := context.Background()
	key, row := []uint64{42}, make([]float32, 4)
	before, _ := served(c, "read-replica", "bounded")
	for round, deadline := 1, time.Now().Add(15*time.Second); ; round++ {
		if err := cl.Push(ctx, "hot", key, []float32{1, 0, 0, 0}); err != nil {
			t.Fatal(err)
		}
		pushes++
		time.Sleep(hotBound + hotBound/10)
		for range 20 {
			if err := cl.Pull(ctx, "hot", key, row); err != nil {
				t.Fatal(err)
			}
			if row[0] != float32(-pushes) {
				t.Fatalf("after %d pushes acknowledged over %s ago a bounded pull read %v", pushes, hotBound, row[0])
			}
		}
		r, _ := served(c, "read-replica", "bounded")
		if r > before+20 && round >= 5 {
			return pushes
		}
		if time.Now().After(deadline) {
			t.Fatalf("read replicas served %d bounded pulls in 15 s", r-before)
		}
	}
}

// waitHot pulls key of table, 50 at a time, until one node's hot set of
// the key's shard is that key alone with at least replicas read replicas;
// it fails the test after 20 s. The node is not skip (-1: any). It returns
// that hot set and the node's index.
func waitHot(t *testing.T, c *Cluster, cl *client.Client, table string, key uint64, replicas, skip int) (*shardpb.HotShard, int) {
	t.Helper()
	row := make([]float32, 4)
	var last []*shardpb.HotShard
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); {
		for range 50 {
			if err := cl.Pull(context.Background(), table, []uint64{key}, row); err != nil {
				t.Fatal(err)
			}
		}
		last = nil
		for i := range c.Len() {
			n := c.Node(i)
			if n == nil || i == skip {
				continue
			}
			for _, hs := range n.HotShards(table) {
				last = append(last, hs)
				if len(hs.Keys) == 1 && hs.Keys[0].Key == key && len(hs.ReplicaIds) >= replicas {
					t.Logf("key %d hot at %.0f pulls/s on %s's shard %d, read replicas %v", key, hs.Keys[0].Rate, c.ID(i), hs.Shard, hs.ReplicaIds)
					return hs, i
				}
			}
		}
	}
	t.Fatalf("hot sets %v after 20 s, want key %d alone with %d read replicas", last, key, replicas)
	return nil, -1
}

// TestHotKeysAfterLeaderKill kills the node that decided a hot set (a
// shard's Raft leader, a chain's head): the shard's next leader decides it
// again and assigns read replicas, which take its assignment (a higher
// term or epoch) and serve the hot key within the bound.
func TestHotKeysAfterLeaderKill(t *testing.T) {
	for _, replication := range []client.Replication{client.Raft, client.Chain} {
		t.Run(string(replication), func(t *testing.T) {
			c, cl := hotCluster(t, replication, nil)
			_, decider := waitHot(t, c, cl, "hot", 42, 2, -1)
			pushes := checkHotPulls(t, c, cl, 0)
			c.Kill(decider)
			t.Logf("killed %s", c.ID(decider))
			// The repair may move a read replica into the replica set, which
			// leaves one node outside it.
			waitHot(t, c, cl, "hot", 42, 1, decider)
			checkHotPulls(t, c, cl, pushes)
		})
	}
}

// TestHotKeysCutOffChainHead cuts a chain's head off from the other nodes.
// A chain head holds no lease, and the cut-off node's map still names it
// head, yet it must stop publishing the shard's hot set while the new head
// takes over: it can confirm no epoch, so it serves no bounded pull, so
// its counts fall and its hot set empties within two windows.
func TestHotKeysCutOffChainHead(t *testing.T) {
	c, cl := hotCluster(t, client.Chain, func(cfg *shard.NodeConfig) { cfg.FaultInjection = true })
	hs, head := waitHot(t, c, cl, "hot", 42, 2, -1)
	if c.Index(c.ShardMap("hot", hs.Shard).Replicas[0]) != head {
		t.Fatalf("%s decides the hot set of a chain headed by %s", c.ID(head), c.ShardMap("hot", hs.Shard).Replicas[0])
	}
	c.cutOff(head)
	defer c.heal()
	cut := time.Now()
	c.waitFor(10*time.Second, c.ID(head)+" stops publishing the hot set", func() bool {
		return len(c.Node(head).HotShards("hot")) == 0
	})
	t.Logf("%s stopped deciding %s after the cut", c.ID(head), time.Since(cut).Round(time.Millisecond))
	waitHot(t, c, cl, "hot", 42, 1, head)
}

// TestCutOffReplicaRefusesBoundedReads kills two of a shard's three nodes,
// so the survivor has no leader to renew its read lease with, and asks it
// directly: a bounded read is refused once the bound has passed since its
// last lease (the client would go elsewhere), a linearizable one at once,
// while an eventual read is still served from what it has.
func TestCutOffReplicaRefusesBoundedReads(t *testing.T) {
	c := StartCluster(t, 3, FastRaft())
	cl := c.Client()
	ctx := context.Background()
	const bound = 100 * time.Millisecond
	spec := levelSpec("cut", client.Bounded, bound)
	spec.Shards = 1
	if _, err := cl.Tables().Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if err := cl.Push(ctx, "cut", []uint64{5}, []float32{2, 0, 0, 0}); err != nil {
		t.Fatal(err)
	}
	c.WaitConverged("cut", 0, 10*time.Second)
	survivor := (c.Leader("cut", 0, 5*time.Second) + 1) % 3
	addr := c.Node(survivor).Addr()
	for i := range 3 {
		if i != survivor {
			c.Kill(i)
		}
	}
	conn, err := grpc.NewClient(addr, c.DialOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	st := shardpb.NewParameterServerClient(conn)
	pull := func(level shardpb.Consistency) (float32, error) {
		return firstValue(st.Pull(ctx, &shardpb.PullRequest{Table: "cut", Shard: 0, Keys: api.KeysBytes([]uint64{5}), Consistency: level, AllowWeaker: true}))
	}
	time.Sleep(bound + bound/2)
	if _, err := pull(shardpb.Consistency_CONSISTENCY_BOUNDED); status.Code(err) != codes.Unavailable || !errors.Is(api.FromStatus(err), api.ErrTooStale) {
		t.Errorf("bounded read of a cut-off replica %s after its lease: %v, want Unavailable %q", bound+bound/2, err, api.ErrTooStale)
	}
	if _, err := pull(shardpb.Consistency_CONSISTENCY_LINEARIZABLE); err == nil {
		t.Error("linearizable read of a cut-off follower succeeded")
	}
	if v, err := pull(shardpb.Consistency_CONSISTENCY_EVENTUAL); err != nil || v != -2 {
		t.Errorf("eventual read of a cut-off replica: %v, %v; want its row -2", v, err)
	}
	// Counted under the survivor's role: leadership may have moved to it
	// after c.Leader looked (a new table's leaders are balanced).
	_, asFollower := served(c, "follower", "bounded")
	_, asLeader := served(c, "leader", "bounded")
	if asFollower+asLeader == 0 {
		t.Error("the refused bounded read was not counted")
	}
}
