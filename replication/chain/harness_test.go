package chain

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/raftps/raftps/replication"
	"github.com/raftps/raftps/replication/internal/reptest"
	"google.golang.org/grpc"
)

// node is one node of a test chain: a real gRPC server on 127.0.0.1
// with its Mux, and the node's replica of the test group.
type node struct {
	addr   string
	dir    string
	server *grpc.Server
	mux    *Mux
}

// cluster runs replicas of one chain group on several nodes in this
// process, talking gRPC over loopback.
type cluster struct {
	t     *testing.T
	cfg   Config
	nodes []*node

	mu     sync.Mutex // guards chains: clients read it while tests stop and start replicas
	chains []*Chain   // nil while a replica is down
	epoch  uint64
	order  []int // node indexes, head first

	clients uint64       // client IDs handed out by runClients
	retries atomic.Int64 // push attempts that failed and were retried
}

func testConfig(dim int) Config {
	return Config{ID: "t/0", Table: reptest.SGDTable("t", dim), RetryInterval: 10 * time.Millisecond, RequestTimeout: 2 * time.Second}
}

// newCluster starts n nodes with replicas configured as the chain
// 0 → 1 → ... → n-1 in epoch 1.
func newCluster(t *testing.T, n int, cfg Config) *cluster {
	c := &cluster{t: t, cfg: cfg}
	for range n {
		c.addNode()
	}
	t.Cleanup(func() {
		for i := range c.nodes {
			c.stopNode(i)
		}
	})
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	c.reconfigure(order...)
	return c
}

// addNode starts a node with an empty replica, not yet in the chain.
func (c *cluster) addNode() int {
	c.t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		c.t.Fatal(err)
	}
	i := len(c.nodes)
	n := &node{addr: lis.Addr().String(), dir: filepath.Join(c.t.TempDir(), fmt.Sprintf("n%d", i)), server: grpc.NewServer(replication.ServerOptions()...)}
	if n.mux, err = NewMux(MuxConfig{LocalAddr: n.addr}); err != nil {
		c.t.Fatal(err)
	}
	n.mux.Register(n.server)
	go n.server.Serve(lis)
	c.mu.Lock()
	c.nodes = append(c.nodes, n)
	c.chains = append(c.chains, nil)
	c.mu.Unlock()
	c.open(i)
	return i
}

// open opens node i's replica from its directory.
func (c *cluster) open(i int) *Chain {
	c.t.Helper()
	cfg := c.cfg
	cfg.Dir, cfg.Mux = c.nodes[i].dir, c.nodes[i].mux
	ch, err := Open(cfg)
	if err != nil {
		c.t.Fatal(err)
	}
	c.mu.Lock()
	c.chains[i] = ch
	c.mu.Unlock()
	return ch
}

// closeChain closes node i's replica, leaving the node's server up.
func (c *cluster) closeChain(i int) {
	c.mu.Lock()
	ch := c.chains[i]
	c.chains[i] = nil
	c.mu.Unlock()
	if ch != nil {
		if err := ch.Close(); err != nil {
			c.t.Logf("closing replica %d: %v", i, err)
		}
	}
}

// stopNode kills node i: its replica and its server.
func (c *cluster) stopNode(i int) {
	c.closeChain(i)
	n := c.nodes[i]
	n.server.Stop()
	n.mux.Close()
}

func (c *cluster) chain(i int) *Chain {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.chains[i]
}

func (c *cluster) live() []*Chain {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*Chain
	for _, i := range c.order {
		if c.chains[i] != nil {
			out = append(out, c.chains[i])
		}
	}
	return out
}

// reconfigure moves the chain to the next epoch with the given nodes, head
// first, telling every live replica (as the meta group would).
func (c *cluster) reconfigure(order ...int) {
	c.t.Helper()
	c.mu.Lock()
	c.epoch++
	epoch := c.epoch
	c.order = order
	addrs := make([]string, len(order))
	for j, i := range order {
		addrs[j] = c.nodes[i].addr
	}
	chains := append([]*Chain(nil), c.chains...)
	c.mu.Unlock()
	for _, ch := range chains {
		if ch != nil {
			if err := ch.SetConfig(epoch, addrs); err != nil {
				c.t.Fatalf("SetConfig(%d, %v): %v", epoch, addrs, err)
			}
		}
	}
}

func (c *cluster) head() *Chain {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.chains[c.order[0]]
}

// push sends p to the head, retrying the same (client, seq) through
// reconfigurations and unknown outcomes until it is acknowledged.
func (c *cluster) push(ctx context.Context, p *replication.Push) (dup bool, err error) {
	for {
		var last error
		if h := c.head(); h != nil {
			cctx, cancel := context.WithTimeout(ctx, time.Second)
			dup, err := h.Push(cctx, p)
			cancel()
			if err == nil {
				return dup, nil
			}
			if !errors.Is(err, ErrNotHead) && !errors.Is(err, replication.ErrUnknownOutcome) && !errors.Is(err, replication.ErrGroupClosed) && !errors.Is(err, context.DeadlineExceeded) {
				return false, err
			}
			last = err
			c.retries.Add(1)
		}
		select {
		case <-ctx.Done():
			return false, fmt.Errorf("push %d/%d never acknowledged (last error %v): %w", p.Client, p.Seq, last, ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// waitConverged waits until every live member has applied and committed
// the same index, then checks their tables are bit-identical.
func (c *cluster) waitConverged(timeout time.Duration) uint64 {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		var ix []uint64
		for _, ch := range c.live() {
			ix = append(ix, ch.AppliedIndex(), ch.CommittedIndex())
		}
		same := len(ix) > 0
		for _, x := range ix {
			same = same && x == ix[0]
		}
		if same {
			break
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("replicas did not converge: applied/committed %v", ix)
		}
		time.Sleep(5 * time.Millisecond)
	}
	var sum uint64
	for i, ch := range c.live() {
		s := ch.Checksum()
		if i == 0 {
			sum = s
		} else if s != sum {
			c.t.Fatalf("member %d checksum %x differs from the head's %x", i, s, sum)
		}
	}
	return sum
}

// runClients starts clients that each push perClient pushes through c,
// acknowledging them in w; it returns when all are acknowledged. during, if
// set, runs once the clients have pushed about a third of their pushes.
func runClients(t *testing.T, c *cluster, w *reptest.Workload, clients, perClient int, during func()) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	// Fresh client IDs each run: a client's seqs start at 1 again.
	c.mu.Lock()
	base := c.clients
	c.clients += uint64(clients)
	c.mu.Unlock()
	var progress sync.WaitGroup
	progress.Add(clients)
	for cl := range clients {
		wg.Go(func() {
			id := base + uint64(cl) + 1
			rng := rand.New(rand.NewPCG(id, 7))
			for s := 1; s <= perClient; s++ {
				if s == perClient/3+1 {
					progress.Done()
				}
				p := &replication.Push{Client: id, Seq: uint64(s)}
				p.Keys, p.Grads = w.Rows(rng)
				if _, err := c.push(ctx, p); err != nil {
					errs <- err
					if s <= perClient/3 {
						progress.Done()
					}
					return
				}
				w.Acknowledge(p.Keys, p.Grads)
			}
		})
	}
	if during != nil {
		progress.Wait()
		during()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}
