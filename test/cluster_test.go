package test

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/raftps/raftps/shard"
	"github.com/raftps/raftps/shard/api"
	"github.com/raftps/raftps/shard/client"
	"github.com/raftps/raftps/shard/shardpb"
	"github.com/raftps/raftps/store"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

const shards = 4

// counterSpec is an SGD table with lr 1 and zero init, so with small integer
// gradients every row is an exact sum, whatever the order of pushes.
func counterSpec(name string, dim int) client.TableSpec {
	return client.TableSpec{Name: name, Dim: dim, Shards: shards, Optimizer: "sgd:lr=1", Initializer: "zeros"}
}

// ledger records acknowledged pushes: the expected rows, and per shard a
// single-node reference table fed the same pushes.
type ledger struct {
	mu    sync.Mutex
	dim   int
	want  map[uint64][]float32
	ref   []*store.Table
	acked atomic.Int64
}

func newLedger(t *testing.T, spec client.TableSpec) *ledger {
	cfg := store.TableConfig{Name: spec.Name, Dim: spec.Dim, Optimizer: store.Optimizer{Kind: store.SGD, LR: 1}}
	l := &ledger{dim: spec.Dim, want: map[uint64][]float32{}}
	for range spec.Shards {
		tab, err := store.NewTable(cfg)
		if err != nil {
			t.Fatal(err)
		}
		l.ref = append(l.ref, tab)
	}
	return l
}

func (l *ledger) record(t *testing.T, keys []uint64, grads []float32) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.acked.Add(1)
	part := map[uint32][]int{}
	for i, k := range keys {
		s := api.ShardOf(k, uint32(len(l.ref)))
		part[s] = append(part[s], i)
		row := l.want[k]
		if row == nil {
			row = make([]float32, l.dim)
			l.want[k] = row
		}
		for c := range row {
			row[c] -= grads[i*l.dim+c]
		}
	}
	for s, idx := range part {
		ks := make([]uint64, 0, len(idx))
		gs := make([]float32, 0, len(idx)*l.dim)
		for _, i := range idx {
			ks = append(ks, keys[i])
			gs = append(gs, grads[i*l.dim:(i+1)*l.dim]...)
		}
		if err := l.ref[s].Apply(ks, gs); err != nil {
			t.Error(err)
		}
	}
}

func randomPush(rng *rand.Rand, dim int) ([]uint64, []float32) {
	n := 1 + rng.IntN(16)
	keys := make([]uint64, n)
	grads := make([]float32, n*dim)
	for i := range keys {
		keys[i] = uint64(rng.IntN(200)) // duplicates within a push happen
	}
	for i := range grads {
		grads[i] = float32(rng.IntN(7) - 3)
	}
	return keys, grads
}

// pushLoad runs clients that push until stop is closed or each made perClient
// pushes, recording every acknowledged push.
func pushLoad(t *testing.T, c *Cluster, l *ledger, table string, clients, perClient int, stop <-chan struct{}) {
	var wg sync.WaitGroup
	for w := range clients {
		cl := c.Client()
		wg.Go(func() { pushWorker(t, cl, l, table, w, 7, perClient, stop) })
	}
	wg.Wait()
}

// pushWorker is client w of a push load: it pushes random batches until
// stop is closed or it made n pushes, recording each acknowledged one. An
// error fails the test and ends the worker.
func pushWorker(t *testing.T, cl *client.Client, l *ledger, table string, w int, seed uint64, n int, stop <-chan struct{}) {
	rng := rand.New(rand.NewPCG(uint64(w), seed))
	for range n {
		select {
		case <-stop:
			return
		default:
		}
		keys, grads := randomPush(rng, l.dim)
		if err := cl.Push(context.Background(), table, keys, grads); err != nil {
			t.Errorf("client %d: %v", w, err)
			return
		}
		l.record(t, keys, grads)
	}
}

// verify checks linearizable pulls against the ledger and every shard's
// replicas against each other and the reference.
func verify(t *testing.T, c *Cluster, l *ledger, table string) {
	t.Helper()
	cl := c.Client()
	l.mu.Lock()
	defer l.mu.Unlock()
	keys := make([]uint64, 0, len(l.want))
	for k := range l.want {
		keys = append(keys, k)
	}
	out := make([]float32, len(keys)*l.dim)
	if err := cl.Pull(context.Background(), table, keys, out); err != nil {
		t.Fatal(err)
	}
	for i, k := range keys {
		for col := range l.dim {
			if out[i*l.dim+col] != l.want[k][col] {
				t.Fatalf("key %d column %d = %v, acknowledged pushes sum to %v (lost or doubled push)", k, col, out[i*l.dim+col], l.want[k][col])
			}
		}
	}
	for s := range uint32(len(l.ref)) {
		sums := c.WaitConverged(table, s, 10*time.Second)
		ref := l.ref[s].Checksum()
		for i, sum := range sums {
			if sum != ref {
				t.Fatalf("shard %d replica %d checksum %x, single-node reference %x", s, i, sum, ref)
			}
		}
	}
}

func TestClusterReplicatesPushes(t *testing.T) {
	waitsMostly(t)
	c := StartCluster(t, 3, FastRaft())
	cl := c.Client()
	spec, err := cl.Tables().Create(context.Background(), counterSpec("emb", 4))
	if err != nil {
		t.Fatal(err)
	}
	l := newLedger(t, spec)
	pushLoad(t, c, l, "emb", 4, 60, nil)
	verify(t, c, l, "emb")
	// Every node knows the table.
	for i := range 3 {
		cl := c.Client()
		tabs, err := cl.Tables().List(context.Background())
		if err != nil || len(tabs) != 1 || tabs[0].Name != "emb" {
			t.Fatalf("node %d lists %v (%v)", i, tabs, err)
		}
	}
}

// TestClusterLeaderKill kills the node leading shard 0 while clients push;
// nothing acknowledged is lost or applied twice, and the node, restarted from
// its data directory, catches up to identical replicas.
func TestClusterLeaderKill(t *testing.T) {
	waitsMostly(t)
	c := StartCluster(t, 3, FastRaft())
	spec, err := c.Client().Tables().Create(context.Background(), counterSpec("emb", 2))
	if err != nil {
		t.Fatal(err)
	}
	l := newLedger(t, spec)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		pushLoad(t, c, l, "emb", 4, 100000, stop)
	}()
	for l.acked.Load() < 200 {
		time.Sleep(5 * time.Millisecond)
	}
	victim := c.Leader("emb", 0, 5*time.Second)
	killed := time.Now()
	c.Kill(victim)
	next := c.Leader("emb", 0, 5*time.Second)
	t.Logf("killed n%d; n%d leads emb/0 after %s", victim+1, next+1, time.Since(killed).Round(time.Millisecond))
	before := l.acked.Load()
	for l.acked.Load() < before+200 {
		time.Sleep(5 * time.Millisecond)
	}
	close(stop)
	<-done
	c.Start(victim)
	verify(t, c, l, "emb")
}

// TestClusterQuietLeaderKill: a table left idle goes quiet (every replica
// on the slow timing, raftps server --quiesce-after); killing the node that
// leads one of its shards still has a new leader within the expedited
// election's silence, not the quiet timer's 5–10 s, and nothing
// acknowledged is lost.
func TestClusterQuietLeaderKill(t *testing.T) {
	waitsMostly(t)
	c := StartCluster(t, 3, FastRaft())
	spec, err := c.Client().Tables().Create(context.Background(), counterSpec("idle", 2))
	if err != nil {
		t.Fatal(err)
	}
	l := newLedger(t, spec)
	pushLoad(t, c, l, "idle", 2, 20, nil)
	allQuiet := func(skip int) bool {
		for i := range 3 {
			if i == skip {
				continue
			}
			if q, n := c.Node(i).QuietReplicas(); n == 0 || q != n {
				return false
			}
		}
		return true
	}
	for deadline := time.Now().Add(15 * time.Second); !allQuiet(-1); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			for i := range 3 {
				q, n := c.Node(i).QuietReplicas()
				t.Logf("n%d: %d of %d replicas quiet", i+1, q, n)
			}
			t.Fatal("an idle table's replicas did not all go quiet within 15 s")
		}
	}
	victim := c.Leader("idle", 0, 5*time.Second)
	killed := time.Now()
	c.Kill(victim)
	next := c.Leader("idle", 0, 10*time.Second)
	took := time.Since(killed)
	t.Logf("killed n%d; n%d leads idle/0 after %s", victim+1, next+1, took.Round(time.Millisecond))
	if took > 3*time.Second {
		t.Fatalf("a quiet shard took %s to replace its dead leader: the quiet timer (5-10 s), not the expedited election", took)
	}
	pushLoad(t, c, l, "idle", 2, 20, nil)
	c.Start(victim)
	verify(t, c, l, "idle")
}

// TestClusterDormantTable: an idle table goes dormant (its leaders step
// down; no replica runs a timer), and the client's requests work on it
// as on any: a push wakes it, an eventual read is served without waking
// it, a bounded and a linearizable read wake it; when the node that led
// it dies while it sleeps, the next push elects a leader among the rest
// within the expedite silence, and nothing acknowledged is lost.
func TestClusterDormantTable(t *testing.T) {
	waitsMostly(t)
	c := StartClusterWith(t, 3, FastRaft(), func(cfg *shard.NodeConfig) {
		cfg.QuiesceAfter, cfg.DormantAfter = 300*time.Millisecond, 500*time.Millisecond
	})
	ctx := context.Background()
	spec, err := c.Client().Tables().Create(ctx, counterSpec("sleepy", 2))
	if err != nil {
		t.Fatal(err)
	}
	l := newLedger(t, spec)
	pushLoad(t, c, l, "sleepy", 2, 20, nil)
	allDormant := func(skip int) func() bool {
		return func() bool {
			for i := range 3 {
				if i == skip {
					continue
				}
				if d, n := c.Node(i).DormantReplicas(); n == 0 || d != n {
					return false
				}
				// A leader is dormant from when its followers agreed
				// until its next idle append makes it step down.
				for sh := range uint32(spec.Shards) {
					if g := c.Node(i).Group("sleepy", sh); g != nil && g.IsLeader() {
						return false
					}
				}
			}
			return true
		}
	}
	c.waitFor(15*time.Second, "every replica of the idle table dormant, and none leading", allDormant(-1))

	start := time.Now()
	pushLoad(t, c, l, "sleepy", 1, 1, nil)
	t.Logf("first push to the dormant table took %s", time.Since(start).Round(time.Millisecond))
	verify(t, c, l, "sleepy")

	c.waitFor(15*time.Second, "every replica dormant again", allDormant(-1))
	keys := []uint64{1, 2, 3, 4, 5, 6, 7, 8}
	out := make([]float32, len(keys)*spec.Dim)
	if err := c.Client().Pull(ctx, "sleepy", keys, out, client.WithConsistency(client.Eventual), client.AllowWeaker()); err != nil {
		t.Fatalf("eventual pull of a dormant table: %v", err)
	}
	if !allDormant(-1)() {
		t.Fatal("an eventual pull woke the dormant table")
	}
	if err := c.Client().Pull(ctx, "sleepy", keys, out, client.WithStaleness(500*time.Millisecond), client.AllowWeaker()); err != nil {
		t.Fatalf("bounded pull of a dormant table: %v", err)
	}

	c.waitFor(15*time.Second, "every replica dormant again", allDormant(-1))
	d, err := c.Client().Tables().Describe(ctx, "sleepy")
	if err != nil {
		t.Fatal(err)
	}
	victim := -1
	for i := range 3 {
		if c.Node(i).ID() == d.Shards[0].LeaderID {
			victim = i
		}
	}
	if victim < 0 {
		t.Fatalf("describe names no former leader of sleepy/0: %+v", d.Shards[0])
	}
	killed := time.Now()
	c.Kill(victim)
	pushLoad(t, c, l, "sleepy", 1, 1, nil)
	took := time.Since(killed)
	t.Logf("killed n%d, which led the dormant table; a push succeeded after %s", victim+1, took.Round(time.Millisecond))
	if took > 3*time.Second {
		t.Fatalf("a dormant table took %s to take a push after its former leader's node died", took)
	}
	c.Start(victim)
	verify(t, c, l, "sleepy")
}

// TestClusterQuietMetaLeaderKill: the metadata group of an idle cluster
// goes quiet too, and its dead leader is still replaced by the expedited
// election, not after the quiet timer (5-10 s): tables can be created at
// once, and the restarted node learns of them.
func TestClusterQuietMetaLeaderKill(t *testing.T) {
	waitsMostly(t)
	c := StartCluster(t, 3, FastRaft())
	c.waitFor(15*time.Second, "every metadata replica on the quiet timing", func() bool {
		for i := range 3 {
			if !c.Node(i).MetaQuiet() {
				return false
			}
		}
		return true
	})
	victim := c.metaLeader()
	killed := time.Now()
	c.Kill(victim)
	c.WaitMetaLeader(10 * time.Second)
	took := time.Since(killed)
	t.Logf("killed n%d, the metadata leader; a new one after %s", victim+1, took.Round(time.Millisecond))
	if took > 3*time.Second {
		t.Fatalf("the quiet metadata group took %s to replace its dead leader: the quiet timer, not the expedited election", took)
	}
	spec := counterSpec("after", 2)
	spec.Replicas = 2 // two nodes live
	if _, err := c.Client().Tables().Create(context.Background(), spec); err != nil {
		t.Fatalf("creating a table after the metadata leader's kill: %v", err)
	}
	c.Start(victim)
	c.waitFor(10*time.Second, "the restarted node to learn of the table", func() bool {
		for _, tb := range c.Node(victim).ClusterMap().Tables {
			if tb.Name == "after" {
				return true
			}
		}
		return false
	})
}

func TestClusterRestartKeepsEverything(t *testing.T) {
	waitsMostly(t)
	c := StartCluster(t, 3, FastRaft())
	spec, err := c.Client().Tables().Create(context.Background(), counterSpec("emb", 3))
	if err != nil {
		t.Fatal(err)
	}
	l := newLedger(t, spec)
	pushLoad(t, c, l, "emb", 2, 50, nil)
	for i := range 3 {
		c.Kill(i)
	}
	for i := range 3 {
		c.Start(i)
	}
	c.WaitMetaLeader(10 * time.Second)
	verify(t, c, l, "emb")
}

// TestClusterBadRequests: every bad input gets its documented code and a
// message naming what is wrong, and changes nothing.
func TestClusterBadRequests(t *testing.T) {
	waitsMostly(t)
	c := StartCluster(t, 3, FastRaft())
	cl := c.Client()
	ctx := context.Background()
	if _, err := cl.Tables().Create(ctx, counterSpec("emb", 2)); err != nil {
		t.Fatal(err)
	}
	leader := c.Leader("emb", 0, 5*time.Second)
	lead := c.RawStub(c.Addrs()[leader])
	follower := c.RawStub(c.Addrs()[(leader+1)%3])
	key0 := uint64(0)
	for api.ShardOf(key0, shards) != 0 {
		key0++
	}
	k := api.KeysBytes([]uint64{key0})
	g := func(v ...float32) []byte { return api.ValuesBytes(v) }
	cases := []struct {
		name string
		call func() error
		code codes.Code
		msg  string
	}{
		{"unknown table", func() error {
			_, err := lead.Push(ctx, &shardpb.PushRequest{Table: "nope", ClientId: 1, Seq: 1, Keys: k, Grads: g(1, 1)})
			return err
		}, codes.NotFound, `"nope"`},
		{"unknown shard", func() error {
			_, err := lead.Pull(ctx, &shardpb.PullRequest{Table: "emb", Shard: 99, Keys: k})
			return err
		}, codes.NotFound, "shard 99"},
		{"wrong dim", func() error {
			_, err := lead.Push(ctx, &shardpb.PushRequest{Table: "emb", ClientId: 1, Seq: 1, Keys: k, Grads: g(1, 1, 1)})
			return err
		}, codes.InvalidArgument, "dim"},
		{"nan", func() error {
			_, err := lead.Push(ctx, &shardpb.PushRequest{Table: "emb", ClientId: 1, Seq: 1, Keys: k, Grads: g(float32(math.NaN()), 1)})
			return err
		}, codes.InvalidArgument, "NaN"},
		{"inf", func() error {
			_, err := lead.Push(ctx, &shardpb.PushRequest{Table: "emb", ClientId: 1, Seq: 1, Keys: k, Grads: g(1, float32(math.Inf(1)))})
			return err
		}, codes.InvalidArgument, "+Inf"},
		{"ragged keys", func() error {
			_, err := lead.Pull(ctx, &shardpb.PullRequest{Table: "emb", Keys: []byte{1, 2, 3}})
			return err
		}, codes.InvalidArgument, "multiple of 8"},
		{"zero client", func() error {
			_, err := lead.Push(ctx, &shardpb.PushRequest{Table: "emb", Keys: k, Grads: g(1, 1)})
			return err
		}, codes.InvalidArgument, "client ID"},
		{"push to a follower", func() error {
			_, err := follower.Push(ctx, &shardpb.PushRequest{Table: "emb", ClientId: 1, Seq: 1, Keys: k, Grads: g(1, 1)})
			return err
		}, codes.FailedPrecondition, "not the leader"},
		{"weaker consistency", func() error {
			_, err := lead.Pull(ctx, &shardpb.PullRequest{Table: "emb", Keys: k, Consistency: shardpb.Consistency_CONSISTENCY_EVENTUAL})
			return err
		}, codes.InvalidArgument, "weaker"},
		{"bad table spec", func() error {
			_, err := lead.CreateTable(ctx, &shardpb.CreateTableRequest{Spec: &shardpb.TableSpec{Name: "x", Dim: 5000}})
			return err
		}, codes.InvalidArgument, "dim = 5000"},
		{"table exists", func() error {
			_, err := c.Client().Tables().Create(ctx, counterSpec("emb", 2))
			return err
		}, codes.AlreadyExists, "already exists"},
	}
	for _, tc := range cases {
		var st *status.Status
		// A moment without a metadata leader (a loaded machine: make
		// test runs packages in parallel) is Unavailable, rightly, and
		// says nothing of the mapping under test: asked again.
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			err := tc.call()
			var re *client.RemoteError
			if errors.As(err, &re) {
				err = status.Error(re.Code, re.Msg)
			}
			st, _ = status.FromError(err)
			if st.Code() != codes.Unavailable || tc.code == codes.Unavailable || time.Now().After(deadline) {
				break
			}
		}
		if st.Code() != tc.code || !strings.Contains(st.Message(), tc.msg) {
			t.Errorf("%s: got %v %q, want %v mentioning %q", tc.name, st.Code(), st.Message(), tc.code, tc.msg)
		}
	}
	// The follower's refusal names the leader, and the client maps it back.
	_, err := follower.Push(ctx, &shardpb.PushRequest{Table: "emb", ClientId: 1, Seq: 1, Keys: k, Grads: g(1, 1)})
	st, _ := status.FromError(err)
	found := false
	for _, d := range st.Details() {
		if info, ok := d.(*shardpb.ErrorInfo); ok && info.Reason == string(api.ReasonNotLeader) && info.LeaderAddr == c.Addrs()[leader] {
			found = true
		}
	}
	if !found {
		t.Fatalf("NOT_LEADER ErrorInfo detail missing or wrong: %v", st.Details())
	}
	if _, err := cl.Tables().Describe(ctx, "nope"); !errors.Is(err, client.ErrUnknownTable) {
		t.Fatalf("client error for an unknown table: %v", err)
	}
	// Nothing was applied: every row is still zero and seq 1 is unused.
	out := make([]float32, 2)
	if err := cl.Pull(ctx, "emb", []uint64{key0}, out); err != nil || out[0] != 0 || out[1] != 0 {
		t.Fatalf("rejected requests changed a row: %v %v", out, err)
	}
	if r, err := lead.Push(ctx, &shardpb.PushRequest{Table: "emb", ClientId: 1, Seq: 1, Keys: k, Grads: g(1, 1)}); err != nil || r.Duplicate {
		t.Fatalf("first good push: %v %v", r, err)
	}
	// Last, because receiving 64 MiB can stall a node past the tests' short
	// heartbeat timeout and move leadership, which the checks above rely on.
	// The request is refused whole and the node goes on serving.
	big := make([]uint64, (shard.DefaultMaxMessageBytes/8)+1024)
	_, err = lead.Pull(ctx, &shardpb.PullRequest{Table: "emb", Keys: api.KeysBytes(big)})
	if st, _ := status.FromError(err); st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), "larger than max") {
		t.Fatalf("oversized pull: got %v, want ResourceExhausted mentioning the limit", err)
	}
	if err := cl.Pull(ctx, "emb", []uint64{key0}, out); err != nil || out[0] != -1 || out[1] != -1 {
		t.Fatalf("after the oversized request: row %v, err %v; want the one push applied (-1, -1)", out, err)
	}
}
