package replication

import (
	"context"
	"fmt"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/raftps/raftps/replication/transportpb"
)

// Term checks: a read's leadership check without a raft message.
//
// A linearizable read asks a majority whether the leader still leads
// (Group.confirmLeadership). A heartbeat answered in the leader's term
// says so, and so does less: a follower whose current term is still the
// leader's, at a moment after the read began, had granted no vote in a
// later term before that moment (raft raises its term before it grants
// one), so no later leader can have been elected by a majority that
// includes it. The leader's own term is checked too, so a majority of
// replicas in its term after the read began rules out a newer leader that
// acknowledged a write before the read began.
//
// A heartbeat costs the follower a msgpack decode, a pass through raft's
// heartbeat handler and an encode of its answer: about 5 % of the
// machine under linearizable pulls (docs/BENCHMARKS.md), which check
// leadership for every group of every PullBatch. A term check reads an atomic. It goes
// through the same per-peer coalescer as the heartbeats, in the same
// messages.
//
// A follower in an older term (one that has not heard from the new leader
// yet) cannot answer for it: the leader then sends that follower a
// heartbeat, which raises its term, as before. Term checks go only to
// peers whose HeartbeatBatch answers say they answer them (takes_confirm);
// an older build gets heartbeats, and so does a peer whose answer to a
// term check took takes_confirm back (a node rolled back to an older
// build answers the check with an error).

// checkTerm asks target for its replica's current term, in the peer's
// next heartbeat message (sent at once). ok is false when target does not
// answer term checks: send it a heartbeat.
func (t *Transport) checkTerm(target raft.ServerAddress, id raft.ServerID, addr []byte, term uint64) (peerTerm uint64, ok bool, err error) {
	if err := t.isClosed(); err != nil {
		return 0, true, err
	}
	if t.mux.cfg.NoConfirms {
		return 0, false, nil
	}
	h := t.mux.heartbeatsTo(target)
	if !h.takesConfirm.Load() {
		return 0, false, nil
	}
	out, err := h.call(&transportpb.RPC{Group: t.group, ConfirmTerm: term, ConfirmId: string(id), ConfirmAddr: string(addr)}, true, t.ctx.Done())
	if err != nil {
		if cerr := t.isClosed(); cerr != nil {
			return 0, true, cerr
		}
		if !h.takesConfirm.Load() {
			// The answer that refused the check also said the peer
			// takes none (send stores that before it answers the
			// calls): it went back to an older build. A heartbeat.
			return 0, false, nil
		}
		return 0, true, fmt.Errorf("raft group %q: term check at %s: %w", t.group, target, err)
	}
	return out.term, true, nil
}

// answerTermCheck answers a term check with this node's replica's current
// term, after the same authorization as the sender's raft messages get.
func (m *Mux) answerTermCheck(ctx context.Context, in *transportpb.RPC) (*transportpb.RPC, error) {
	if in.Group == "" {
		return nil, status.Error(codes.InvalidArgument, "term check without a group")
	}
	if in.ConfirmId == "" || in.ConfirmAddr == "" {
		return nil, status.Errorf(codes.InvalidArgument, "raft group %q: a term check without its sender's ID and address", in.Group)
	}
	t, err := m.lookup(in.Group)
	if err != nil {
		return nil, err
	}
	if check := m.cfg.Authorize; check != nil {
		if err := check(ctx, in.Group, in.ConfirmId, in.ConfirmAddr); err != nil {
			return nil, err
		}
	}
	r := t.raft.Load()
	if r == nil {
		return nil, status.Errorf(codes.Unavailable, "raft group %q: replica not running yet", in.Group)
	}
	if err := t.isClosed(); err != nil {
		// Safe to answer even so (a closed replica votes no more, and
		// its next incarnation has a transport of its own), but say so.
		return nil, status.Errorf(codes.NotFound, "raft group %q closed on this node", in.Group)
	}
	m.heardFrom(raft.ServerAddress(in.ConfirmAddr))
	m.stats.TermChecksAnswered.Add(1)
	return &transportpb.RPC{Group: in.Group, ConfirmTerm: r.CurrentTerm()}, nil
}
