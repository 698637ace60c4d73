package replication

// nextBatch is the group commit that Raft groups and chain heads share. It
// waits for the next push (or takes *carry, left over from the last
// batch), then for a free in-flight slot, so that while the log is busy the
// pushes that arrive wait together; then it drains whatever else is queued,
// up to limit bytes of pushes, leaving the first that does not fit in
// *carry. ok is false once closed is closed; a push already taken is then
// answered with closedErr.
func nextBatch(pushCh <-chan *pending, inflight chan<- struct{}, closed <-chan struct{},
	closedErr func() error, limit int, carry **pending) (batch []*pending, size int, ok bool) {
	first := *carry
	*carry = nil
	if first == nil {
		select {
		case first = <-pushCh:
		case <-closed:
			return nil, 0, false
		}
	}
	select {
	case inflight <- struct{}{}:
	case <-closed:
		first.done <- pushOutcome{err: closedErr()}
		return nil, 0, false
	}
	batch = []*pending{first}
	size = len(first.enc)
	for size < limit {
		select {
		case p := <-pushCh:
			if size+len(p.enc) > limit {
				*carry = p
				return batch, size, true
			}
			batch = append(batch, p)
			size += len(p.enc)
		default:
			return batch, size, true
		}
	}
	return batch, size, true
}
