package chain

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/raftps/raftps/replication"
	"github.com/raftps/raftps/replication/chain/chainpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// snapshotChunk is the size of the snapshot pieces a predecessor sends.
const snapshotChunk = 1 << 20

// errCompacted: the sender needs entries its log no longer holds; it
// reconnects, and the handshake then sends a snapshot.
var errCompacted = errors.New("entries compacted away")

// ---- predecessor side ----

// startSenderLocked starts the goroutine that feeds the successor, if this
// replica has one. Caller holds mu.
func (c *Chain) startSenderLocked() {
	if c.role == RoleNone || c.succ == "" || c.broken != nil || c.isClosed() {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	c.senderStop = cancel
	c.sendGen++
	epoch, succ, gen, synced := c.epoch, c.succ, c.sendGen, c.syncCh
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		c.sendLoop(ctx, gen, epoch, succ, synced)
	}()
}

// sendLoop keeps a stream to succ open for epoch, reconnecting after
// failures, until ctx ends (a new configuration, Close, a disk failure).
//
// It opens no stream before synced is closed (markSyncedLocked): an
// unsynced member's log may hold entries the chain never committed, and a
// successor fed from it would apply them and, as the tail, commit them.
func (c *Chain) sendLoop(ctx context.Context, gen, epoch uint64, succ string, synced <-chan struct{}) {
	select {
	case <-synced:
	case <-ctx.Done():
		return
	}
	for {
		err := c.replicateTo(ctx, gen, epoch, succ)
		if ctx.Err() != nil {
			return
		}
		c.log.Debug("stream to successor ended; reconnecting", "successor", succ, "epoch", epoch, "error", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(c.cfg.RetryInterval):
		}
	}
}

// replicateTo runs one stream to succ: the handshake, a snapshot if the
// successor needs one, then entries as they are appended, while a second
// goroutine takes the successor's acks.
func (c *Chain) replicateTo(ctx context.Context, gen, epoch uint64, succ string) error {
	cc, err := c.mux.conn(succ)
	if err != nil {
		return err
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := chainpb.NewChainClient(cc).Replicate(sctx)
	if err != nil {
		return fmt.Errorf("opening stream to %s: %w", succ, err)
	}
	if err := stream.Send(&chainpb.Forward{Group: c.cfg.ID, From: c.cfg.NodeAddr, Epoch: epoch, CommitFloor: c.floor()}); err != nil {
		return fmt.Errorf("hello to %s: %w", succ, err)
	}
	hello, err := stream.Recv()
	if err != nil {
		return fmt.Errorf("hello from %s: %w", succ, err)
	}
	if hello.Code != chainpb.Code_OK {
		return codeError(succ, hello.Code, hello.Error)
	}
	if !hello.Hello {
		return fmt.Errorf("%s answered the hello without its state", succ)
	}
	c.onAck(gen, epoch, hello.CommittedIndex)
	next, snapshot, err := c.resumePoint(hello.AppliedIndex, hello.AppliedEpoch)
	if err != nil {
		return err
	}
	if !snapshot {
		// The successor's log matches this one up to its last entry: tell it
		// so at once (entries may not follow soon), which lets it count its
		// log as committed-by-the-chain (markSyncedLocked).
		if err := stream.Send(&chainpb.Forward{Epoch: epoch, CommitFloor: c.floor(), FirstIndex: next}); err != nil {
			return fmt.Errorf("resuming %s at %d: %w", succ, next, err)
		}
	}

	acks := make(chan error, 1)
	var wg sync.WaitGroup
	wg.Go(func() { acks <- c.receiveAcks(stream, gen, epoch, succ) })
	defer func() {
		cancel() // ends the stream, so receiveAcks returns
		wg.Wait()
	}()
	if snapshot {
		c.log.Info("sending snapshot to successor", "successor", succ, "successor-applied", hello.AppliedIndex)
		if next, err = c.sendSnapshot(stream, epoch); err != nil {
			return err
		}
	}
	for {
		if c.pauseForward.Load() { // test hook
			select {
			case <-time.After(5 * time.Millisecond):
				continue
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		entries, appended, err := c.entriesFrom(next)
		if err != nil {
			return err
		}
		if len(entries) == 0 {
			select {
			case <-appended:
				continue
			case <-ctx.Done():
				return ctx.Err()
			case err := <-acks:
				return err
			}
		}
		if err := stream.Send(&chainpb.Forward{Epoch: epoch, CommitFloor: c.floor(), FirstIndex: next, Entries: entries}); err != nil {
			return fmt.Errorf("forwarding to %s: %w", succ, err)
		}
		next += uint64(len(entries))
	}
}

// receiveAcks takes the successor's committed index until the stream ends.
func (c *Chain) receiveAcks(stream grpc.BidiStreamingClient[chainpb.Forward, chainpb.Ack], gen, epoch uint64, succ string) error {
	for {
		a, err := stream.Recv()
		if err != nil {
			return fmt.Errorf("acks from %s: %w", succ, err)
		}
		if a.Code != chainpb.Code_OK {
			return codeError(succ, a.Code, a.Error)
		}
		if a.Epoch != epoch {
			return fmt.Errorf("%s acked in epoch %d on a stream of epoch %d: %w", succ, a.Epoch, epoch, ErrStaleEpoch)
		}
		c.onAck(gen, epoch, a.CommittedIndex)
	}
}

// onAck records that the successor, in epoch, has committed ix, on the
// stream of sender gen. Acks of an older sender (before a snapshot replaced
// this log) speak of a log that is gone; and an unsynced member's log is not
// known to be the chain's (its sender does not run then, so this is a guard).
func (c *Chain) onAck(gen, epoch, ix uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if epoch != c.epoch || gen != c.sendGen || c.role == RoleNone || !c.syncedLocked() {
		return
	}
	c.commitLocked(min(ix, c.fsm.AppliedIndex()))
}

// floor is what this replica sends as the chain's commit floor.
func (c *Chain) floor() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return max(c.commitFloor, c.committed)
}

// resumePoint decides where to resume the successor, which reports it has
// applied up to ix, an entry created in epoch: at ix+1 if this log holds
// the same entry at ix (then, by induction over the streams, the same log up
// to it) and the entries after it; otherwise the successor gets a snapshot.
func (c *Chain) resumePoint(ix, epoch uint64) (next uint64, snapshot bool, err error) {
	c.applyMu.Lock()
	defer c.applyMu.Unlock()
	if ix > c.last {
		return 0, true, nil // the successor applied entries this log lacks
	}
	ep, ok, err := c.epochAtLocked(ix)
	if err != nil {
		return 0, false, err
	}
	if !ok || ep != epoch {
		return 0, true, nil
	}
	if ix < c.last {
		if _, ok, err := c.epochAtLocked(ix + 1); err != nil || !ok {
			return 0, err == nil, err
		}
	}
	return ix + 1, false, nil
}

// epochAtLocked returns the creation epoch of entry ix, if known: index 0
// (the empty log) has epoch 0. Caller holds applyMu.
func (c *Chain) epochAtLocked(ix uint64) (uint64, bool, error) {
	switch {
	case ix == 0:
		return 0, true, nil
	case ix == c.snapIndex:
		return c.snapEpoch, true, nil
	case ix == c.last:
		return c.lastEpoch, true, nil
	}
	c.mu.Lock()
	if ix >= c.memFirst && ix < c.memFirst+uint64(len(c.mem)) {
		ep := entryEpoch(c.mem[ix-c.memFirst])
		c.mu.Unlock()
		return ep, true, nil
	}
	c.mu.Unlock()
	return c.st.epochAt(ix)
}

// entriesFrom returns entries from index next on (up to batchBytes and
// MaxForwardEntries, at least one), or none if next is past the last entry; appended is closed
// when another entry is appended.
func (c *Chain) entriesFrom(next uint64) (entries [][]byte, appended <-chan struct{}, err error) {
	c.mu.Lock()
	appended = c.appendCh
	end := c.memFirst + uint64(len(c.mem)) // one past the last entry
	if next >= end {
		c.mu.Unlock()
		return nil, appended, nil
	}
	if next >= c.memFirst {
		size := 0
		for _, e := range c.mem[next-c.memFirst:] {
			if len(entries) > 0 && (size+len(e) > batchBytes || len(entries) == MaxForwardEntries) {
				break
			}
			entries = append(entries, e)
			size += len(e)
		}
		c.mu.Unlock()
		return entries, appended, nil
	}
	c.mu.Unlock()
	if entries, err = c.st.read(next, batchBytes); err != nil {
		return nil, nil, c.failStorage(fmt.Errorf("reading log from %d: %w", next, err))
	}
	if len(entries) == 0 {
		return nil, nil, fmt.Errorf("entry %d: %w", next, errCompacted)
	}
	return entries, appended, nil
}

// sendSnapshot streams a snapshot of the current state; it returns the
// index entries resume from.
func (c *Chain) sendSnapshot(stream grpc.BidiStreamingClient[chainpb.Forward, chainpb.Ack], epoch uint64) (uint64, error) {
	c.applyMu.Lock()
	s := c.fsm.Snapshot()
	ix, ep := c.last, c.lastEpoch
	c.applyMu.Unlock()
	defer s.Release()
	sink := &streamSink{stream: stream, epoch: epoch, index: ix, snapEpoch: ep, first: true}
	_, err := s.WriteTo(sink)
	if err == nil {
		err = sink.Close()
	}
	if err != nil {
		return 0, fmt.Errorf("sending snapshot %d: %w", ix, err)
	}
	return ix + 1, nil
}

// streamSink sends a snapshot in snapshotChunk pieces; Close sends the
// last message.
type streamSink struct {
	stream       grpc.BidiStreamingClient[chainpb.Forward, chainpb.Ack]
	epoch, index uint64
	snapEpoch    uint64
	first        bool
}

func (s *streamSink) msg() *chainpb.Forward {
	m := &chainpb.Forward{Epoch: s.epoch, SnapshotStart: s.first, SnapshotIndex: s.index, SnapshotEpoch: s.snapEpoch}
	s.first = false
	return m
}

func (s *streamSink) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		k := min(len(p), snapshotChunk)
		m := s.msg()
		// Copied: gRPC may encode the message after Send returns.
		m.SnapshotData = append([]byte(nil), p[:k]...)
		if err := s.stream.Send(m); err != nil {
			return n, err
		}
		p, n = p[k:], n+k
	}
	return n, nil
}

func (s *streamSink) Close() error {
	m := s.msg()
	m.SnapshotDone = true
	return s.stream.Send(m)
}

// ---- successor side ----

// inboundStream is a predecessor's stream this replica serves.
type inboundStream struct{ cancel context.CancelFunc }

// checkPeerLocked returns why a message of epoch must be refused, if it
// must. Caller holds mu.
func (c *Chain) checkPeerLocked(epoch uint64) error {
	switch {
	case c.isClosed():
		return c.closedErr()
	case c.broken != nil:
		return c.broken
	case epoch < c.epoch:
		return fmt.Errorf("chain %s: %w: message of epoch %d, replica is in %d", c.cfg.ID, ErrStaleEpoch, epoch, c.epoch)
	case epoch > c.epoch:
		return fmt.Errorf("chain %s: %w: message of epoch %d, replica is in %d", c.cfg.ID, ErrEpochAhead, epoch, c.epoch)
	case c.role == RoleNone:
		return fmt.Errorf("chain %s: %w in epoch %d", c.cfg.ID, ErrNotMember, c.epoch)
	}
	return nil
}

// serveReplicate serves the stream a predecessor opened (first is its
// hello): it answers with this replica's state, applies what follows on
// another goroutine, and sends acks as the committed index grows. A newer
// stream, a new configuration or Close ends it.
func (c *Chain) serveReplicate(stream grpc.BidiStreamingServer[chainpb.Forward, chainpb.Ack], first *chainpb.Forward) error {
	refuse := func(err error) error {
		return stream.Send(&chainpb.Ack{Code: codeOf(err), Error: err.Error(), Epoch: c.Epoch()})
	}
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	in := &inboundStream{cancel: cancel}

	c.applyMu.Lock() // so the hello's applied index is exact
	c.mu.Lock()
	err := c.checkPeerLocked(first.Epoch)
	if err == nil && first.From != c.pred {
		err = fmt.Errorf("chain %s: %w: %s in epoch %d (predecessor: %q)", c.cfg.ID, errNotPredecessor, first.From, c.epoch, c.pred)
	}
	if err != nil {
		c.mu.Unlock()
		c.applyMu.Unlock()
		return refuse(err)
	}
	for s := range c.inbound { // one predecessor stream at a time
		s.cancel()
		delete(c.inbound, s)
	}
	c.inbound[in] = struct{}{}
	epoch := c.epoch
	// Not synced yet (unless it already was in this epoch): the hello only
	// opens the handshake; the predecessor's next message settles it.
	c.commitFloor = max(c.commitFloor, first.CommitFloor)
	hello := &chainpb.Ack{Epoch: epoch, Hello: true, AppliedIndex: c.last, AppliedEpoch: c.lastEpoch, CommittedIndex: c.committed}
	commitCh, sent := c.commitCh, c.committed
	recvDone := make(chan error, 1)
	c.wg.Add(1) // under mu: Close has not started waiting (checkPeerLocked saw it open)
	c.mu.Unlock()
	c.applyMu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.inbound, in)
		c.mu.Unlock()
	}()
	if err := stream.Send(hello); err != nil {
		cancel()
		c.wg.Done()
		return err
	}
	// Recv runs on its own goroutine so that this one can end the stream on
	// cancel; once the handler returns, gRPC ends a pending Recv.
	go func() {
		defer c.wg.Done()
		recvDone <- c.receiveForwards(ctx, stream, epoch)
	}()
	for {
		select {
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		case err := <-recvDone:
			if err == nil || errors.Is(err, io.EOF) {
				return nil
			}
			if codeOf(err) != chainpb.Code_BAD_REQUEST || errors.Is(err, replication.ErrBadRequest) {
				return refuse(err)
			}
			return err
		case <-commitCh:
			c.mu.Lock()
			commitCh = c.commitCh
			ix, cur := c.committed, c.epoch
			c.mu.Unlock()
			if cur != epoch {
				// A commit of the next epoch: acks on this stream speak
				// for this one only.
				return status.Error(codes.Aborted, "configuration changed")
			}
			if ix > sent {
				if err := stream.Send(&chainpb.Ack{Epoch: epoch, CommittedIndex: ix}); err != nil {
					return err
				}
				sent = ix
			}
		}
	}
}

// receiveForwards applies what the predecessor sends until the stream ends.
// The first message after the hello settles the handshake: a snapshot
// (installSnapshot), or entries or an empty resume message from the index
// after this replica's last entry (the predecessor matched the logs).
func (c *Chain) receiveForwards(ctx context.Context, stream grpc.BidiStreamingServer[chainpb.Forward, chainpb.Ack], epoch uint64) error {
	settled := false
	for {
		msg, err := stream.Recv()
		if err != nil {
			return err
		}
		if msg.Epoch != epoch {
			return fmt.Errorf("chain %s: %w: message of epoch %d on a stream of epoch %d", c.cfg.ID, ErrStaleEpoch, msg.Epoch, epoch)
		}
		if !settled && !msg.SnapshotStart && msg.FirstIndex > 0 {
			if err := c.settle(ctx, epoch, msg.FirstIndex); err != nil {
				return err
			}
		}
		switch {
		case msg.SnapshotStart:
			err = c.installSnapshot(ctx, stream, msg, epoch)
			settled = err == nil
		case msg.FirstIndex > 0:
			settled = true
			if len(msg.Entries) > 0 {
				err = c.applyForwarded(ctx, epoch, msg.FirstIndex, msg.Entries)
			}
		}
		if err != nil {
			return err
		}
		c.mu.Lock()
		c.commitFloor = max(c.commitFloor, msg.CommitFloor)
		c.mu.Unlock()
	}
}

// settle ends the handshake of a stream the predecessor resumes at first:
// it matched this log's last entry, so first must follow it; the log is
// then a prefix of the predecessor's (markSyncedLocked).
func (c *Chain) settle(ctx context.Context, epoch, first uint64) error {
	c.applyMu.Lock()
	defer c.applyMu.Unlock()
	if err := ctx.Err(); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.checkPeerLocked(epoch); err != nil {
		return err
	}
	if first != c.last+1 {
		return fmt.Errorf("chain %s: %w: predecessor resumes at %d, the log ends at %d", c.cfg.ID, replication.ErrBadRequest, first, c.last)
	}
	c.markSyncedLocked()
	return nil
}

// applyForwarded persists and applies entries from the predecessor.
func (c *Chain) applyForwarded(ctx context.Context, epoch, first uint64, entries [][]byte) error {
	c.applyMu.Lock()
	defer c.applyMu.Unlock()
	if err := ctx.Err(); err != nil {
		return err // superseded: a newer stream or configuration decides
	}
	c.mu.Lock()
	err := c.checkPeerLocked(epoch)
	c.mu.Unlock()
	if err != nil {
		return err
	}
	// An entry must hold its epoch; what follows is the FSM's to judge (a
	// command it cannot apply is refused alike on every member, not here,
	// where refusing would stall the stream for ever).
	for i, e := range entries {
		if len(e) < entryHeader {
			return fmt.Errorf("chain %s: %w: entry %d is %d bytes", c.cfg.ID, replication.ErrBadRequest, first+uint64(i), len(e))
		}
	}
	// Entries this log holds already are the same (the handshake matched
	// the logs); skip them.
	if first <= c.last {
		skip := c.last + 1 - first
		if skip >= uint64(len(entries)) {
			return nil
		}
		entries, first = entries[skip:], c.last+1
	}
	return c.appendLocked(first, entries, nil)
}

// installSnapshot receives a snapshot (first is its first piece) into a
// file, then replaces the replica's state and log with it.
func (c *Chain) installSnapshot(ctx context.Context, stream grpc.BidiStreamingServer[chainpb.Forward, chainpb.Ack], first *chainpb.Forward, epoch uint64) error {
	c.snapMu.Lock()
	defer c.snapMu.Unlock()
	ix, ep := first.SnapshotIndex, first.SnapshotEpoch
	var recvErr error
	msg := first
	// Received into a temporary file and restored from it before it takes
	// the place of a snapshot file: a snapshot damaged in transit must not
	// replace this replica's own snapshot of the same index.
	tmp, err := c.st.writeTemp(ix, func(w io.Writer) error {
		for {
			if sp := c.cfg.Space; sp != nil {
				if recvErr = sp.Admit(int64(len(msg.SnapshotData))); recvErr != nil {
					recvErr = fmt.Errorf("chain %s: snapshot %d: %w", c.cfg.ID, ix, recvErr)
					return recvErr
				}
			}
			if _, err := w.Write(msg.SnapshotData); err != nil {
				return err
			}
			if msg.SnapshotDone {
				return nil
			}
			if msg, recvErr = stream.Recv(); recvErr != nil {
				return recvErr
			}
			if msg.Epoch != epoch || msg.SnapshotIndex != ix || msg.SnapshotStart {
				recvErr = fmt.Errorf("chain %s: %w: snapshot %d interrupted by another message", c.cfg.ID, replication.ErrBadRequest, ix)
				return recvErr
			}
		}
	})
	if recvErr != nil {
		return recvErr
	}
	if err != nil {
		return c.failStorage(err)
	}
	defer os.Remove(tmp) // a no-op once promoted

	c.applyMu.Lock()
	defer c.applyMu.Unlock()
	if err := ctx.Err(); err != nil {
		return err
	}
	c.mu.Lock()
	err = c.checkPeerLocked(epoch)
	c.mu.Unlock()
	if err != nil {
		return err
	}
	f, err := os.Open(tmp)
	if err != nil {
		return c.failStorage(err)
	}
	if err := c.fsm.Restore(f); err != nil { // closes f; on error the state is unchanged
		return fmt.Errorf("chain %s: installing snapshot %d: %w", c.cfg.ID, ix, err)
	}
	// From here the in-memory state is the snapshot's: a failure to record
	// it must stop the replica.
	if err := c.st.promote(tmp, ix); err != nil {
		return c.failStorage(err)
	}
	if err := c.st.useSnapshot(ix, ep, 0, true); err != nil {
		return c.failStorage(fmt.Errorf("recording snapshot %d: %w", ix, err))
	}
	c.log.Info("installed snapshot from predecessor", "index", ix, "previous", c.last)
	c.last, c.lastEpoch, c.snapIndex, c.snapEpoch, c.sinceSnap = ix, ep, ix, ep, 0
	c.installs++

	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.mem)
	c.mem, c.memFirst = c.mem[:0], ix+1
	if c.committed > ix { // only if the meta group broke the prefix rule
		c.committed = ix
		c.committedIx.Store(ix)
	}
	// Which keys the snapshot's uncommitted entries touched is unknown:
	// every key counts as dirty until the commit reaches the snapshot.
	c.dirtyMu.Lock()
	clear(c.dirty)
	clear(c.dirtyLog)
	c.dirtyLog = c.dirtyLog[:0]
	c.dirtyUntil = 0
	if c.committed < ix {
		c.dirtyUntil = ix
	}
	c.dirtyMu.Unlock()
	if c.succ == "" {
		c.commitLocked(ix)
	}
	// The log is now the predecessor's: synced (a tail commits it all).
	c.markSyncedLocked()
	// The successor was fed from the log just replaced: handshake again.
	if c.senderStop != nil {
		c.senderStop()
		c.senderStop = nil
	}
	c.startSenderLocked()
	close(c.appendCh)
	c.appendCh = make(chan struct{})
	return nil
}
