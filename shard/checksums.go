package shard

import (
	"context"
	"sync"
	"time"

	"github.com/raftps/raftps/store"
)

// replicaSum is a replica's checksum and the applied index it belongs to.
type replicaSum struct {
	applied, sum uint64
}

// checksumCache rate-limits the checksums Status reports: a pass over this
// node's replicas runs at most once per Limits.ChecksumInterval, and at most
// one at a time; callers meanwhile share the last pass's results, or wait
// for the one running. A replica whose applied index has not moved since
// the last pass keeps its checksum without being read again. Without it any
// caller could make the node read every row of every replica on each call.
// (Status is meant for administrators; once the client listener
// authenticates callers it is to be admin-only as well.)
//
// Concurrency: mu guards every field; a pass runs without it.
type checksumCache struct {
	mu      sync.Mutex
	sums    map[string]replicaSum // by group ID
	last    time.Time             // when the last pass ended
	running chan struct{}         // closed when the running pass ends; nil if none
}

// checksums returns every replica's checksum as of the last pass, running
// a new one first if the last is older than the interval.
func (n *Node) checksums(ctx context.Context) map[string]replicaSum {
	c := &n.sums
	c.mu.Lock()
	for c.running != nil {
		running := c.running
		c.mu.Unlock()
		select {
		case <-running:
		case <-ctx.Done():
			c.mu.Lock()
			defer c.mu.Unlock()
			return c.sums
		}
		c.mu.Lock()
	}
	if c.sums != nil && time.Since(c.last) < n.cfg.ChecksumInterval {
		defer c.mu.Unlock()
		return c.sums
	}
	running, prev := make(chan struct{}), c.sums
	c.running = running
	c.mu.Unlock()

	sums := n.checksumPass(prev)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sums, c.last, c.running = sums, time.Now(), nil
	close(running)
	return sums
}

// checksumPass reads the checksum of every replica on this node whose
// applied index moved since prev, keeping only those taken while nothing
// was applied (only they belong to an applied index).
func (n *Node) checksumPass(prev map[string]replicaSum) map[string]replicaSum {
	type replica struct {
		id      string
		applied func() uint64
		table   func() *store.Table
	}
	var rs []replica
	n.mu.RLock()
	for id, g := range n.groups {
		rs = append(rs, replica{id, g.AppliedIndex, g.Table})
	}
	for id, ch := range n.chains {
		rs = append(rs, replica{id, ch.AppliedIndex, ch.Table})
	}
	n.mu.RUnlock()
	sums := make(map[string]replicaSum, len(rs))
	for _, r := range rs {
		ix := r.applied()
		if p, ok := prev[r.id]; ok && p.applied == ix {
			sums[r.id] = p
			continue
		}
		sum := r.table().Checksum()
		if r.applied() == ix {
			sums[r.id] = replicaSum{applied: ix, sum: sum}
		}
	}
	return sums
}
