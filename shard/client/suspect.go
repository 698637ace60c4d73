package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/raftps/raftps/shard/shardpb"
)

// Telling a dead node from a slow one.
//
// A node that was killed with its machine, paused, or cut off by the network
// does not refuse a call: the call just waits, for the client's whole
// attempt timeout. Its peers know better and sooner. Every node hears from
// each node it shares a Raft group with several times per heartbeat
// interval (heartbeats, appends, their answers), so "node B has not heard
// from A for a quarter of a second" is strong evidence that A is gone. A
// client whose call to A is unanswered after SuspectAfter asks two other
// nodes (PeerContact), and gives the call up, outcome unknown, as soon as
// one of them has been without word from A for SuspectSilence. The retry
// that follows carries the same (client, seq), so a push is still applied
// at most once, and meanwhile the shard's followers elect a new leader
// (the nodes' expedited elections use the same evidence).

// silentNodeError is why an attempt was given up before its timeout.
type silentNodeError struct {
	by     string
	silent time.Duration
}

func (e *silentNodeError) Error() string {
	return fmt.Sprintf("node %s has not heard from it for %s", e.by, e.silent.Round(time.Millisecond))
}

// attemptContext bounds one call to addr: by AttemptTimeout, and, unless
// turned off, by what addr's peers say once the call has waited SuspectAfter.
// The asking runs on a timer, so a call answered in time costs no goroutine.
func (c *Client) attemptContext(ctx context.Context, addr string) (context.Context, context.CancelFunc) {
	tctx, cancelTimeout := context.WithTimeout(ctx, c.cfg.AttemptTimeout)
	if c.cfg.SuspectAfter < 0 || c.cfg.AttemptTimeout <= c.cfg.SuspectAfter || len(c.cfg.Addrs) < 2 {
		return tctx, cancelTimeout
	}
	actx, cancelCause := context.WithCancelCause(tctx)
	var (
		mu      sync.Mutex // guards timer and stopped
		timer   *time.Timer
		stopped bool
	)
	check := func() {
		if err := c.askPeers(actx, addr); err != nil {
			cancelCause(err)
			return
		}
		mu.Lock()
		if !stopped {
			timer.Reset(c.cfg.SuspectAfter / 3)
		}
		mu.Unlock()
	}
	mu.Lock()
	timer = time.AfterFunc(c.cfg.SuspectAfter, check)
	mu.Unlock()
	return actx, func() {
		mu.Lock()
		stopped = true
		timer.Stop()
		mu.Unlock()
		cancelCause(nil)
		cancelTimeout()
	}
}

// askPeers asks up to two other nodes when they last heard from addr; it
// returns a *silentNodeError as soon as one has not for SuspectSilence, nil
// if none says so (or none answers within SuspectAfter).
func (c *Client) askPeers(ctx context.Context, addr string) error {
	var peers []string
	for _, a := range c.order(c.cfg.Addrs) {
		if a != addr && !c.isSilent(a) {
			peers = append(peers, a)
			if len(peers) == 2 {
				break
			}
		}
	}
	if len(peers) == 0 {
		return nil
	}
	qctx, cancel := context.WithTimeout(ctx, c.cfg.SuspectAfter)
	defer cancel()
	answers := make(chan error, len(peers))
	for _, p := range peers {
		go func() {
			st, err := c.stub(p)
			if err != nil {
				answers <- nil
				return
			}
			r, err := st.PeerContact(qctx, &shardpb.PeerContactRequest{Addr: addr})
			if err != nil || !r.Known || time.Duration(r.SilentNs) < c.cfg.SuspectSilence {
				answers <- nil
				return
			}
			answers <- &silentNodeError{by: p, silent: time.Duration(r.SilentNs)}
		}()
	}
	for range peers {
		if err := <-answers; err != nil {
			return err
		}
	}
	return nil
}

// abandoned turns the error of a call to addr that ran out of time, or was
// given up because addr's peers no longer hear from it, into a retryable
// ErrUnavailable (outcome unknown) and marks addr silent; it returns nil for
// any other error. The caller's own context must still be alive.
func (c *Client) abandoned(actx context.Context, addr string, err error) error {
	var se *silentNodeError
	switch {
	case errors.As(context.Cause(actx), &se):
		c.markSilent(addr)
		return fmt.Errorf("raftps client: %s: %w: no answer, and %v (outcome unknown): %v", addr, ErrUnavailable, se, err)
	case errors.Is(actx.Err(), context.DeadlineExceeded):
		c.markSilent(addr)
		return fmt.Errorf("raftps client: %s: %w: no answer within the attempt timeout %s (outcome unknown): %v", addr, ErrUnavailable, c.cfg.AttemptTimeout, err)
	}
	return nil
}
