package replication

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	"github.com/raftps/raftps/replication/transportpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Limits of a heartbeat batch: the most heartbeats one message carries
// (a sender with more queued sends several), and how many of a batch the
// receiver serves at once.
const (
	MaxHeartbeatBatch = 1024
	HeartbeatWorkers  = 16
)

// sendHeartbeat sends a heartbeat through the peer's coalescer.
// urgent says whether it may not wait for others (HeartbeatDelay).
func (t *Transport) sendHeartbeat(target raft.ServerAddress, args *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse, urgent bool) error {
	if err := t.isClosed(); err != nil {
		return err
	}
	payload, err := encode(args)
	if err != nil {
		return err
	}
	return t.timedHeartbeat(target, resp, func(word uint64) (uint64, error) {
		out, err := t.mux.heartbeatsTo(target).call(&transportpb.RPC{Group: t.group, Msgpack: payload, Timing: word}, urgent, t.ctx.Done())
		if err != nil {
			if cerr := t.isClosed(); cerr != nil {
				return 0, cerr // cut short by Close
			}
			return 0, fmt.Errorf("raft group %q: heartbeat to %s: %w", t.group, target, err)
		}
		return out.timing, decode(out.msgpack, resp)
	})
}

// sendHeartbeatAlone sends an eager transport's heartbeat (SendEagerly) in
// a message of its own: the metadata group's must not wait behind a batch
// of every shard group's to a slow peer.
func (t *Transport) sendHeartbeatAlone(target raft.ServerAddress, args *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) error {
	return t.timedHeartbeat(target, resp, func(word uint64) (answered uint64, err error) {
		err = t.unaryWithin(t.mux.cfg.HeartbeatTimeout, target, args, resp, func(c transportpb.RaftTransportClient, ctx context.Context, r *transportpb.RPC) (*transportpb.RPC, error) {
			r.Timing = word
			out, err := c.AppendEntries(ctx, r)
			if err == nil {
				answered = out.Timing
			}
			return out, err
		})
		return answered, err
	})
}

// timedHeartbeat sends one heartbeat to target with the group's timing
// word (transport_quiet.go): send carries word, fills resp and returns the
// word the follower answered. An answered heartbeat counts toward the
// leader's going quiet; a failed one on the quiet timing wakes the group
// (unless the transport is closing):
// a follower that does not answer may be restarting, and back on raft's
// fast timer a leader retries it within 100 ms, on the quiet one only
// after up to half the quiet timeout, while a restarted replica, on the
// fast timing of a new process, campaigns in vain meanwhile.
func (t *Transport) timedHeartbeat(target raft.ServerAddress, resp *raft.AppendEntriesResponse, send func(word uint64) (uint64, error)) error {
	q := t.quiet.Load()
	var word uint64
	if q != nil {
		word = q.sent(target)
	}
	answered, err := send(word)
	if err != nil {
		if q != nil && word&wordQuiet != 0 && t.isClosed() == nil {
			q.wake()
		}
		return err
	}
	if q != nil && word != 0 && resp.Success {
		q.acked(target, answered)
	}
	return nil
}

// heartbeatNow sends a heartbeat that does not wait for others to share
// its message: a leadership check that a read waits for.
func (t *Transport) heartbeatNow(_ raft.ServerID, target raft.ServerAddress, args *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) error {
	return t.sendHeartbeat(target, args, resp, true)
}

// heartbeats coalesces the heartbeats that this node's groups send to one
// peer. Raft's periodic heartbeats wait up to MuxConfig.HeartbeatDelay for
// others to join them: idle groups' timers are randomised and rarely
// coincide, so without the wait every heartbeat was a message of its own.
// An urgent heartbeat (a leadership check of a read, confirmLeadership)
// sends what is queued at once. Those that arrive while a message is in
// flight wait for it and go out together in the next. So a burst from N
// groups (a PullBatch verifying leadership of every group it touches)
// costs one message, not N.
//
// Concurrency: mu guards queue and busy. At most one goroutine (run) sends
// at a time; it exits when the queue is empty. It is not tracked by the Mux:
// a message in flight when the Mux closes ends with its connection, or with
// the transport timeout.
type heartbeats struct {
	m      *Mux
	target raft.ServerAddress
	urgent chan struct{} // a token cuts run's wait short

	mu    sync.Mutex
	queue []*hbCall
	busy  bool

	// takesConfirm: the peer's last answer said it answers term checks
	// (transport_confirm.go). Each answer sets it anew, so a peer that
	// goes back to an older build is no longer sent them.
	takesConfirm atomic.Bool
}

type hbCall struct {
	rpc  *transportpb.RPC
	done chan hbResult
}

type hbResult struct {
	msgpack []byte
	timing  uint64 // the follower's answer to the heartbeat's timing word
	term    uint64 // the follower's answer to a term check
	err     error
}

func (m *Mux) heartbeatsTo(target raft.ServerAddress) *heartbeats {
	m.connMu.Lock()
	defer m.connMu.Unlock()
	h := m.hbs[target]
	if h == nil {
		h = &heartbeats{m: m, target: target, urgent: make(chan struct{}, 1)}
		m.hbs[target] = h
	}
	return h
}

// call sends one heartbeat and waits for its answer, or until closed is
// closed: the calling group's transport is closing, and raft's Shutdown
// waits for the replicator making this call, which would otherwise wait up
// to HeartbeatTimeout per group for a peer that does not answer. The answer
// that comes later goes into done's buffer, unread.
func (h *heartbeats) call(rpc *transportpb.RPC, urgent bool, closed <-chan struct{}) (hbResult, error) {
	c := &hbCall{rpc: rpc, done: make(chan hbResult, 1)}
	h.mu.Lock()
	h.queue = append(h.queue, c)
	if !h.busy {
		h.busy = true
		go h.run()
	}
	h.mu.Unlock()
	if urgent {
		select {
		case h.urgent <- struct{}{}:
		default:
		}
	}
	select {
	case r := <-c.done:
		return r, r.err
	case <-closed:
		return hbResult{}, ErrTransportClosed
	}
}

func (h *heartbeats) run() {
	for {
		if d := h.m.cfg.HeartbeatDelay; d > 0 {
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-h.urgent:
			}
			t.Stop()
		}
		h.mu.Lock()
		batch := h.queue
		if len(batch) > MaxHeartbeatBatch {
			batch, h.queue = batch[:MaxHeartbeatBatch:MaxHeartbeatBatch], batch[MaxHeartbeatBatch:]
		} else {
			h.queue = nil
		}
		if len(batch) == 0 {
			h.busy = false
			h.mu.Unlock()
			return
		}
		h.mu.Unlock()
		h.send(batch)
	}
}

func (h *heartbeats) send(batch []*hbCall) {
	fail := func(err error) {
		for _, c := range batch {
			c.done <- hbResult{err: err}
		}
	}
	client, err := h.m.client(h.target)
	if err != nil {
		fail(err)
		return
	}
	req := &transportpb.HeartbeatBatch{Rpcs: make([]*transportpb.RPC, len(batch))}
	checks := 0
	for i, c := range batch {
		req.Rpcs[i] = c.rpc
		if c.rpc.ConfirmTerm != 0 {
			checks++
		}
	}
	h.m.stats.HeartbeatsSent.Add(int64(len(batch) - checks))
	h.m.stats.TermChecksSent.Add(int64(checks))
	h.m.stats.HeartbeatBatches.Add(1)
	ctx, cancel := context.WithTimeout(context.Background(), h.m.cfg.HeartbeatTimeout)
	out, err := client.Heartbeats(ctx, req)
	cancel()
	if err != nil {
		fail(err)
		return
	}
	h.m.heardFrom(h.target)
	h.takesConfirm.Store(out.TakesConfirm)
	if len(out.Rpcs) != len(batch) {
		fail(fmt.Errorf("peer answered %d heartbeats for %d", len(out.Rpcs), len(batch)))
		return
	}
	for i, c := range batch {
		if e := out.Rpcs[i].Error; e != "" {
			c.done <- hbResult{err: errors.New(e)}
		} else {
			c.done <- hbResult{msgpack: out.Rpcs[i].Msgpack, timing: out.Rpcs[i].Timing, term: out.Rpcs[i].ConfirmTerm}
		}
	}
}

// handleHeartbeat hands rpc to the heartbeat handler, if there is one, and
// says whether there was. The read lock is held while the handler runs, so
// that Close, which takes the write lock, waits for it. The handler does
// not block on raft's main loop (it answers on rpc's buffered channel), so
// Close waits at most for one heartbeat's processing.
func (t *Transport) handleHeartbeat(rpc raft.RPC) bool {
	t.hbMu.RLock()
	defer t.hbMu.RUnlock()
	if t.heartbeat == nil {
		return false
	}
	t.heartbeat(rpc)
	return true
}

// isHeartbeat mirrors raft's NetworkTransport: a request with a term and a
// leader, and nothing else. Every raftps node runs raft v1.7+, which sets
// RPCHeader.Addr, so the deprecated Leader field is not consulted.
func isHeartbeat(r *raft.AppendEntriesRequest) bool {
	return r.Term != 0 && len(r.RPCHeader.Addr) != 0 && r.PrevLogEntry == 0 && r.PrevLogTerm == 0 &&
		len(r.Entries) == 0 && r.LeaderCommitIndex == 0
}

// Heartbeats answers each group's heartbeat of a batch, HeartbeatWorkers
// at a time, so a group whose Raft is slow to answer delays few others,
// and a batch costs a bounded number of goroutines however long it is.
//
// The batch is answered after at most half the heartbeat timeout, those
// not done by then with an error of their own: a heartbeat that makes a
// replica take a new term writes it to disk first, and on a loaded
// machine a few such writes made whole batches time out at the sender, so
// that every group in them missed its heartbeat, stepped down and held an
// election, whose new terms made the next batches slower still.
func (s *muxServer) Heartbeats(ctx context.Context, in *transportpb.HeartbeatBatch) (*transportpb.HeartbeatBatch, error) {
	n := len(in.Rpcs)
	if n > MaxHeartbeatBatch {
		return nil, status.Errorf(codes.ResourceExhausted, "heartbeat batch of %d heartbeats; the limit is %d per message (MaxHeartbeatBatch)", n, MaxHeartbeatBatch)
	}
	var mu sync.Mutex // guards answers, written by the workers
	answers := make([]*transportpb.RPC, n)
	done := make(chan struct{})
	go func() {
		defer close(done)
		ServeBounded(n, HeartbeatWorkers, func(i int) {
			r := in.Rpcs[i]
			var resp *transportpb.RPC
			var err error
			if r.ConfirmTerm != 0 && !s.m.cfg.NoConfirms {
				resp, err = s.m.answerTermCheck(ctx, r)
			} else {
				resp, err = serveUnary[raft.AppendEntriesRequest](ctx, s.m, r, false)
			}
			if err != nil {
				resp = &transportpb.RPC{Group: r.Group, Error: err.Error()}
			}
			mu.Lock()
			answers[i] = resp
			mu.Unlock()
		})
	}()
	timer := time.NewTimer(s.m.cfg.HeartbeatTimeout / 2)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
	case <-ctx.Done():
	}
	out := &transportpb.HeartbeatBatch{Rpcs: make([]*transportpb.RPC, n), TakesConfirm: !s.m.cfg.NoConfirms}
	mu.Lock()
	defer mu.Unlock()
	for i, a := range answers {
		if a == nil {
			a = &transportpb.RPC{Group: in.Rpcs[i].Group, Error: fmt.Sprintf("raft group %q: heartbeat not answered within %s", in.Rpcs[i].Group, s.m.cfg.HeartbeatTimeout/2)}
		}
		out.Rpcs[i] = a
	}
	return out, nil
}

// ServeBounded calls one(i) for every i below n, on at most workers
// goroutines at once, and returns when all have returned: a request of
// many elements costs a few goroutines, not one per element.
func ServeBounded(n, workers int, one func(i int)) {
	if n == 1 || workers <= 1 {
		for i := range n {
			one(i)
		}
		return
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(n, workers) {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				one(i)
			}
		})
	}
	wg.Wait()
}
