package client

import (
	"slices"
	"sync"
	"time"
)

// Hedged reads (Dean and Barroso, "The Tail at Scale"). A read that other
// replicas may serve too (bounded, eventual, hot keys, a chain's CRAQ
// reads) should not wait for one node that stalls: a garbage-collection
// pause, a stuck disk, a frozen process, a half-open connection. A call
// unanswered past the hedge threshold sends its parts to their next
// candidates as well; the first good answer of each wins. Bounded reads
// keep their promise (every replica refuses a read it cannot show is
// within the bound), linearizable reads theirs (they have no candidates
// but the leader).
//
// The threshold is the 90th percentile of this client's recent hedgeable
// calls, at least Config.HedgeAfter: a call that slow is already in the
// slowest tenth. Hedges are paid for from a budget that every hedgeable
// call adds Config.HedgeBudget to (at most hedgeBurst saved up), so at most
// that share of calls is hedged and a slow cluster does not double its
// own load. A node a hedge beat is marked slow and asked after the others
// for slowFor, so the next pulls go elsewhere while it recovers.

// Defaults of the hedging settings.
const (
	DefaultHedgeAfter  = 20 * time.Millisecond
	DefaultHedgeBudget = 0.1
)

const (
	// latencyWindow is how many recent hedgeable calls the threshold is
	// taken from.
	latencyWindow = 128
	// hedgeBurst caps the hedges saved up while nothing was late.
	hedgeBurst = 10
	// slowFor is how long a node a hedge beat is asked after the others.
	slowFor = 2 * time.Second
)

// hedgeState is a client's hedging bookkeeping; mu guards all but slow.
type hedgeState struct {
	slow   marks // nodes a hedge beat lately; its own lock
	mu     sync.Mutex
	lat    [latencyWindow]time.Duration // ring of recent latencies
	n      int                          // latencies recorded, up to latencyWindow
	next   int                          // where the next one goes
	credit float64
	// sorted is scratch for the percentile, reused under mu.
	sorted []time.Duration
	// Hedges counts the hedge calls sent, for tests and the benchmark.
	hedges uint64
}

func (c *Client) hedging() bool { return c.cfg.HedgeAfter > 0 && c.cfg.HedgeBudget > 0 }

// hedgeAfter is how long a hedgeable call may go unanswered before it is
// hedged.
func (c *Client) hedgeAfter() time.Duration {
	h := &c.hedge
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.n < latencyWindow/8 {
		// Too few calls yet to know what slow is.
		return max(c.cfg.HedgeAfter, 2*DefaultHedgeAfter)
	}
	h.sorted = append(h.sorted[:0], h.lat[:h.n]...)
	slices.Sort(h.sorted)
	return max(c.cfg.HedgeAfter, h.sorted[h.n*9/10])
}

// noteLatency records a hedgeable call's latency.
func (c *Client) noteLatency(d time.Duration) {
	h := &c.hedge
	h.mu.Lock()
	h.lat[h.next] = d
	h.next = (h.next + 1) % latencyWindow
	h.n = min(h.n+1, latencyWindow)
	h.mu.Unlock()
}

// hedgeCredit adds a hedgeable call's share to the budget.
func (c *Client) hedgeCredit() {
	h := &c.hedge
	h.mu.Lock()
	h.credit = min(h.credit+c.cfg.HedgeBudget, hedgeBurst)
	h.mu.Unlock()
}

// takeHedge pays for one hedge call, if the budget allows.
func (c *Client) takeHedge() bool {
	h := &c.hedge
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.credit < 1 {
		return false
	}
	h.credit--
	h.hedges++
	return true
}

// Hedges returns how many hedge calls the client has sent.
func (c *Client) Hedges() uint64 {
	c.hedge.mu.Lock()
	defer c.hedge.mu.Unlock()
	return c.hedge.hedges
}

func (c *Client) markSlow(addr string)    { c.hedge.slow.mark(addr) }
func (c *Client) isSlow(addr string) bool { return c.hedge.slow.has(addr) }
