package chain

import (
	"context"
	"fmt"

	"github.com/raftps/raftps/replication"
	"github.com/raftps/raftps/replication/chain/chainpb"
)

// ReadMode says how a chain replica may answer a Pull.
type ReadMode uint8

const (
	// ReadLinearizable: only the tail answers, from what it has applied
	// (everything applied at a synced tail is committed), while it is the
	// tail of its current epoch, its predecessor's stream has settled its log
	// in this epoch and it has caught up with its predecessor's commit index.
	ReadLinearizable ReadMode = iota
	// ReadCRAQ: any member answers keys that are clean (no applied but
	// uncommitted entry touches them) from its own state, and asks the tail
	// for the dirty ones.
	ReadCRAQ
	// ReadAny: any member answers from what it has applied; the index
	// returned is its committed index, for the caller's staleness policy.
	ReadAny
)

func (m ReadMode) String() string {
	switch m {
	case ReadLinearizable:
		return "linearizable"
	case ReadCRAQ:
		return "craq"
	case ReadAny:
		return "any"
	}
	return fmt.Sprintf("ReadMode(%d)", uint8(m))
}

// Pull copies the rows of keys into out (len(keys) × dim values) as mode
// allows, and returns an index the rows are at least as new as: the tail's
// applied index (ReadLinearizable, and ReadCRAQ when it asked the tail) or
// this replica's committed index.
//
// Why CRAQ's clean reads are linearizable: every member's log is a prefix of
// its predecessor's, so an entry is applied at a member before the tail
// applies (commits) it. A key is marked dirty, under dirtyMu, before an
// entry touching it is applied here, and unmarked only once the commit
// index has passed it; the check and the lookup share one hold of dirtyMu.
// So a clean key's value here is that of the newest entry touching it that
// this member applied, which is committed, and any later committed entry
// touching it would have been applied here first and made it dirty. A member
// that may lack committed entries or hold uncommitted ones it cannot tell
// apart (a new member, or one whose predecessor's stream has not settled its
// log in this epoch) is not "caught up" and sends the whole read to the
// tail.
func (c *Chain) Pull(ctx context.Context, keys []uint64, out []float32, mode ReadMode) (uint64, error) {
	if dim := c.cfg.Table.Dim; len(out) != len(keys)*dim {
		return 0, fmt.Errorf("chain %s: %w: out holds %d values for %d keys of dim %d", c.cfg.ID, replication.ErrBadRequest, len(out), len(keys), dim)
	}
	c.mu.Lock()
	err := c.checkServingLocked()
	tail := c.succ == ""
	ready := c.caughtUpLocked()
	epoch := c.epoch
	tailAddr := ""
	if len(c.order) > 0 {
		tailAddr = c.order[len(c.order)-1]
	}
	c.mu.Unlock()
	if err != nil {
		return 0, err
	}
	switch mode {
	case ReadAny:
		ix := c.committedIx.Load()
		return ix, c.lookup(keys, out)
	case ReadLinearizable, ReadCRAQ:
	default:
		return 0, fmt.Errorf("chain %s: %w: read mode %d", c.cfg.ID, replication.ErrBadRequest, mode)
	}
	if tail {
		if !ready {
			return 0, fmt.Errorf("chain %s: %w: new tail has not applied its predecessor's commit index yet", c.cfg.ID, ErrNotReady)
		}
		ix := c.fsm.AppliedIndex()
		return ix, c.lookup(keys, out)
	}
	if mode == ReadLinearizable {
		return 0, fmt.Errorf("chain %s: %w: linearizable reads go to the tail, %s", c.cfg.ID, ErrNotTail, tailAddr)
	}
	if !ready {
		return c.mux.tailRead(ctx, c.cfg.RequestTimeout, tailAddr, c.cfg.ID, epoch, keys, out)
	}
	var dirty []int // positions of dirty keys; nil when all are clean
	c.dirtyMu.RLock()
	if c.dirtyUntil != 0 {
		c.dirtyMu.RUnlock()
		return c.mux.tailRead(ctx, c.cfg.RequestTimeout, tailAddr, c.cfg.ID, epoch, keys, out)
	}
	if len(c.dirty) > 0 {
		for i, k := range keys {
			if c.dirty[k] > 0 {
				dirty = append(dirty, i)
			}
		}
	}
	err = c.lookup(keys, out)
	ix := c.committedIx.Load()
	c.dirtyMu.RUnlock()
	if err != nil || len(dirty) == 0 {
		return ix, err
	}
	dim := c.cfg.Table.Dim
	dk := make([]uint64, len(dirty))
	for j, i := range dirty {
		dk[j] = keys[i]
	}
	rows := make([]float32, len(dk)*dim)
	tix, err := c.mux.tailRead(ctx, c.cfg.RequestTimeout, tailAddr, c.cfg.ID, epoch, dk, rows)
	if err != nil {
		return 0, err
	}
	for j, i := range dirty {
		copy(out[i*dim:(i+1)*dim], rows[j*dim:(j+1)*dim])
	}
	return max(ix, tix), nil
}

func (c *Chain) lookup(keys []uint64, out []float32) error {
	if err := c.Table().Lookup(keys, out); err != nil {
		return fmt.Errorf("chain %s: %w", c.cfg.ID, err)
	}
	return nil
}

// checkServingLocked returns why this replica cannot serve reads at all.
func (c *Chain) checkServingLocked() error {
	switch {
	case c.isClosed():
		return c.closedErr()
	case c.broken != nil:
		return c.broken
	case c.role == RoleNone:
		return fmt.Errorf("chain %s: %w in epoch %d", c.cfg.ID, ErrNotMember, c.epoch)
	}
	return nil
}

// CaughtUp reports whether this replica is a member that holds every
// committed entry it can know of (caughtUpLocked): the meta group makes a
// member head only if it is, since a head's log is the chain's truth.
func (c *Chain) CaughtUp() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.role != RoleNone && c.broken == nil && c.caughtUpLocked()
}

// caughtUpLocked reports whether this member holds every committed entry
// it can know of, and nothing else it would count as committed: the head
// always (every other member's log is a prefix of its own); another member
// once its predecessor's stream of this epoch has settled its log (said
// hello, then matched it or replaced it with a snapshot: syncedLocked) and
// it has applied the commit floor that predecessor sent. A hello alone is
// not enough: until the handshake settles, the log may end in a removed
// head's entries that the chain never committed.
func (c *Chain) caughtUpLocked() bool {
	if c.pred == "" {
		return true
	}
	return c.syncedLocked() && c.fsm.AppliedIndex() >= c.commitFloor
}

// serveRead answers a member's read of dirty keys, if this replica is the
// caught-up tail of the caller's epoch.
func (c *Chain) serveRead(req *chainpb.ReadRequest) *chainpb.ReadResponse {
	c.mu.Lock()
	err := c.checkPeerLocked(req.Epoch)
	if err == nil && c.succ != "" {
		err = fmt.Errorf("chain %s: %w in epoch %d", c.cfg.ID, ErrNotTail, c.epoch)
	}
	if err == nil && !c.caughtUpLocked() {
		err = fmt.Errorf("chain %s: %w: new tail has not applied its predecessor's commit index yet", c.cfg.ID, ErrNotReady)
	}
	epoch := c.epoch
	c.mu.Unlock()
	if err != nil {
		return &chainpb.ReadResponse{Code: codeOf(err), Error: err.Error(), Epoch: epoch}
	}
	keys := make([]uint64, len(req.Keys)/8)
	copy(replication.KeysBytes(keys), req.Keys)
	out := make([]float32, len(keys)*c.cfg.Table.Dim)
	ix := c.fsm.AppliedIndex()
	if err := c.lookup(keys, out); err != nil {
		return &chainpb.ReadResponse{Code: codeOf(err), Error: err.Error(), Epoch: epoch}
	}
	return &chainpb.ReadResponse{Epoch: epoch, Rows: replication.ValuesBytes(out), AppliedIndex: ix}
}
