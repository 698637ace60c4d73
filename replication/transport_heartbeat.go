package replication

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/hashicorp/raft"
	"github.com/raftps/raftps/replication/transportpb"
)

// sendHeartbeat sends a heartbeat through the peer's coalescer.
func (t *Transport) sendHeartbeat(target raft.ServerAddress, args *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) error {
	if err := t.isClosed(); err != nil {
		return err
	}
	payload, err := encode(args)
	if err != nil {
		return err
	}
	out, err := t.mux.heartbeatsTo(target).call(&transportpb.RPC{Group: t.group, Msgpack: payload}, t.ctx.Done())
	if err != nil {
		if cerr := t.isClosed(); cerr != nil {
			return cerr // cut short by Close
		}
		return fmt.Errorf("raft group %q: heartbeat to %s: %w", t.group, target, err)
	}
	return decode(out, resp)
}

// heartbeats coalesces the heartbeats that this node's groups send to one
// peer. The first goes out at once; those that arrive while a message is in
// flight wait for it and go out together in the next. So a heartbeat waits
// at most one round trip more, and a burst from N groups (a PullBatch
// verifying leadership of every group it touches) costs one message, not N.
//
// Concurrency: mu guards queue and busy. At most one goroutine (run) sends
// at a time; it exits when the queue is empty. It is not tracked by the Mux:
// a message in flight when the Mux closes ends with its connection, or with
// the transport timeout.
type heartbeats struct {
	m      *Mux
	target raft.ServerAddress

	mu    sync.Mutex
	queue []*hbCall
	busy  bool
}

type hbCall struct {
	rpc  *transportpb.RPC
	done chan hbResult
}

type hbResult struct {
	msgpack []byte
	err     error
}

func (m *Mux) heartbeatsTo(target raft.ServerAddress) *heartbeats {
	m.connMu.Lock()
	defer m.connMu.Unlock()
	h := m.hbs[target]
	if h == nil {
		h = &heartbeats{m: m, target: target}
		m.hbs[target] = h
	}
	return h
}

// call sends one heartbeat and waits for its answer, or until closed is
// closed: the calling group's transport is closing, and raft's Shutdown
// waits for the replicator making this call, which would otherwise wait up
// to HeartbeatTimeout per group for a peer that does not answer. The answer
// that comes later goes into done's buffer, unread.
func (h *heartbeats) call(rpc *transportpb.RPC, closed <-chan struct{}) ([]byte, error) {
	c := &hbCall{rpc: rpc, done: make(chan hbResult, 1)}
	h.mu.Lock()
	h.queue = append(h.queue, c)
	if !h.busy {
		h.busy = true
		go h.run()
	}
	h.mu.Unlock()
	select {
	case r := <-c.done:
		return r.msgpack, r.err
	case <-closed:
		return nil, ErrTransportClosed
	}
}

func (h *heartbeats) run() {
	for {
		h.mu.Lock()
		batch := h.queue
		h.queue = nil
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
	for i, c := range batch {
		req.Rpcs[i] = c.rpc
	}
	h.m.stats.HeartbeatsSent.Add(int64(len(batch)))
	h.m.stats.HeartbeatBatches.Add(1)
	ctx, cancel := context.WithTimeout(context.Background(), h.m.cfg.HeartbeatTimeout)
	out, err := client.Heartbeats(ctx, req)
	cancel()
	if err != nil {
		fail(err)
		return
	}
	h.m.heardFrom(h.target)
	if len(out.Rpcs) != len(batch) {
		fail(fmt.Errorf("peer answered %d heartbeats for %d", len(out.Rpcs), len(batch)))
		return
	}
	for i, c := range batch {
		if e := out.Rpcs[i].Error; e != "" {
			c.done <- hbResult{err: errors.New(e)}
		} else {
			c.done <- hbResult{msgpack: out.Rpcs[i].Msgpack}
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

// Heartbeats answers each group's heartbeat of a batch, concurrently, so a
// group whose Raft is slow to answer delays only its own.
func (s *muxServer) Heartbeats(ctx context.Context, in *transportpb.HeartbeatBatch) (*transportpb.HeartbeatBatch, error) {
	out := &transportpb.HeartbeatBatch{Rpcs: make([]*transportpb.RPC, len(in.Rpcs))}
	var wg sync.WaitGroup
	for i, r := range in.Rpcs {
		wg.Go(func() {
			resp, err := serveUnary[raft.AppendEntriesRequest](ctx, s.m, r, false)
			if err != nil {
				resp = &transportpb.RPC{Group: r.Group, Error: err.Error()}
			}
			out.Rpcs[i] = resp
		})
	}
	wg.Wait()
	return out, nil
}
