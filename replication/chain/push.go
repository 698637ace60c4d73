package chain

import (
	"context"
	"encoding/binary"
	"time"

	"github.com/raftps/raftps/replication"
)

// Push applies p through the chain and returns once the tail has applied it
// (it is then on every member). duplicate is true if this (client, seq) had
// been applied before; the push is then not applied again. Only the head
// takes pushes: elsewhere Push returns a *NotHeadError.
//
// The caller's slices are copied before Push returns. On ErrNotHead, a
// validation error or ErrReplicaBroken (the push failed to persist) the push
// was not applied; on replication.ErrUnknownOutcome (timeout,
// reconfiguration, Close) or a context error it may have been: retry with the
// same (client, seq), at the head of the newest configuration. It is applied
// at most once.
//
// A push whose (client, seq) the head finds already applied is still logged
// and answered only when that new entry commits: the earlier entry that
// applied it may not be committed yet, and answering at once could
// acknowledge a push that a head failure then loses.
func (c *Chain) Push(ctx context.Context, p *replication.Push) (duplicate bool, err error) {
	if err := c.batcher.Check(c.Table(), p); err != nil {
		return false, err
	}
	if err := c.checkHead(); err != nil {
		return false, err
	}
	return c.batcher.Submit(ctx, p)
}

// checkHead returns nil if this replica is the head and healthy.
func (c *Chain) checkHead() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.checkHeadLocked()
}

func (c *Chain) checkHeadLocked() error {
	switch {
	case c.isClosed():
		return c.closedErr()
	case c.broken != nil:
		return c.broken
	case c.role != RoleHead:
		head := ""
		if len(c.order) > 0 {
			head = c.order[0]
		}
		return &NotHeadError{Group: c.cfg.ID, Epoch: c.epoch, Head: head}
	}
	return nil
}

// batchLoop turns queued pushes into log entries: group commit. It waits for
// a free in-flight slot before draining the queue, so while the chain is busy
// the pushes that arrive wait together and go out as one entry; and while
// the head is persisting one entry, the next gathers.
func (c *Chain) batchLoop() {
	defer c.wg.Done()
	for {
		batch, ok := c.batcher.Next()
		if !ok {
			return
		}
		if err := c.appendHead(batch); err != nil {
			batch.Fail(err)
		}
	}
}

// appendHead logs batch as the next entry, if this replica is still the
// head. On error nothing was applied.
func (c *Chain) appendHead(batch *replication.Batch) error {
	c.applyMu.Lock()
	defer c.applyMu.Unlock()
	c.mu.Lock()
	err := c.checkHeadLocked()
	epoch := c.epoch
	c.mu.Unlock()
	if err != nil {
		return err
	}
	// The head's clock goes into the entry: every replica's dedupe expiry
	// uses it, never its own clock.
	e := binary.LittleEndian.AppendUint64(make([]byte, 0, entryHeader), epoch)
	e = batch.AppendCommand(e, time.Now().UnixNano())
	return c.appendLocked(c.last+1, [][]byte{e}, &headEntry{batch: batch})
}
