package replication

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

	"google.golang.org/grpc"
)

// chainNode is one node of a test chain: a real gRPC server on 127.0.0.1
// with its ChainMux, and the node's replica of the test group.
type chainNode struct {
	addr   string
	dir    string
	server *grpc.Server
	mux    *ChainMux
}

// chainCluster runs replicas of one chain group on several nodes in this
// process, talking gRPC over loopback.
type chainCluster struct {
	t     *testing.T
	cfg   ChainConfig
	nodes []*chainNode

	mu     sync.Mutex // guards chains: clients read it while tests stop and start replicas
	chains []*Chain   // nil while a replica is down
	epoch  uint64
	order  []int // node indexes, head first

	clients uint64       // client IDs handed out by runChainClients
	retries atomic.Int64 // push attempts that failed and were retried
}

func chainTestConfig(dim int) ChainConfig {
	return ChainConfig{ID: "t/0", Table: sgdTable("t", dim), RetryInterval: 10 * time.Millisecond, RequestTimeout: 2 * time.Second}
}

// newChainCluster starts n nodes with replicas configured as the chain
// 0 → 1 → ... → n-1 in epoch 1.
func newChainCluster(t *testing.T, n int, cfg ChainConfig) *chainCluster {
	c := &chainCluster{t: t, cfg: cfg}
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
func (c *chainCluster) addNode() int {
	c.t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		c.t.Fatal(err)
	}
	i := len(c.nodes)
	n := &chainNode{addr: lis.Addr().String(), dir: filepath.Join(c.t.TempDir(), fmt.Sprintf("n%d", i)), server: grpc.NewServer(ServerOptions()...)}
	if n.mux, err = NewChainMux(ChainMuxConfig{LocalAddr: n.addr}); err != nil {
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
func (c *chainCluster) open(i int) *Chain {
	c.t.Helper()
	cfg := c.cfg
	cfg.Dir, cfg.Mux = c.nodes[i].dir, c.nodes[i].mux
	ch, err := OpenChain(cfg)
	if err != nil {
		c.t.Fatal(err)
	}
	c.mu.Lock()
	c.chains[i] = ch
	c.mu.Unlock()
	return ch
}

// closeChain closes node i's replica, leaving the node's server up.
func (c *chainCluster) closeChain(i int) {
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
func (c *chainCluster) stopNode(i int) {
	c.closeChain(i)
	n := c.nodes[i]
	n.server.Stop()
	n.mux.Close()
}

func (c *chainCluster) chain(i int) *Chain {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.chains[i]
}

func (c *chainCluster) live() []*Chain {
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
func (c *chainCluster) reconfigure(order ...int) {
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

func (c *chainCluster) head() *Chain {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.chains[c.order[0]]
}

// push sends p to the head, retrying the same (client, seq) through
// reconfigurations and unknown outcomes until it is acknowledged.
func (c *chainCluster) push(ctx context.Context, p *Push) (dup bool, err error) {
	for {
		var last error
		if h := c.head(); h != nil {
			cctx, cancel := context.WithTimeout(ctx, time.Second)
			dup, err := h.Push(cctx, p)
			cancel()
			if err == nil {
				return dup, nil
			}
			if !errors.Is(err, ErrNotHead) && !errors.Is(err, ErrUnknownOutcome) && !errors.Is(err, ErrGroupClosed) && !errors.Is(err, context.DeadlineExceeded) {
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
func (c *chainCluster) waitConverged(timeout time.Duration) uint64 {
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

// runChainClients starts clients that each push perClient pushes through c,
// acknowledging them in w; it returns when all are acknowledged. during, if
// set, runs once the clients have pushed about a third of their pushes.
func runChainClients(t *testing.T, c *chainCluster, w *workload, clients, perClient int, during func()) {
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
				p := w.makePush(rng, id, uint64(s))
				if _, err := c.push(ctx, p); err != nil {
					errs <- err
					if s <= perClient/3 {
						progress.Done()
					}
					return
				}
				w.acknowledge(p)
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
