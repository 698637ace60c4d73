package replication

import (
	"context"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
)

// Dormant groups: idle groups without a leader.
//
// A quiet group (transport_quiet.go) still runs raft's leader: its lease
// check every leader lease timeout, and for each follower a replicator
// woken every commit timeout, whose appends the transport answers from
// memory. At 256 idle groups on a 3-node cluster that was most of the
// servers' idle CPU (docs/BENCHMARKS.md), and hashicorp/raft cannot slow
// those timers while it runs. A group without a leader has none of them.
//
// A group whose log has not moved for QuietAfter + DormantAfter goes
// dormant, in two steps, both the leader's:
//
//  1. Its heartbeats carry the dormant word. A follower that accepts one
//     sets its heartbeat and election timeouts to an hour
//     (dormantTimeout): it will not campaign while its leader is silent.
//  2. Once every follower answered that word, the leader takes the same
//     timing, and its transport answers its next idle append as a
//     follower of a later term would (answerDormant): raft steps down at
//     once. The term is not raised anywhere; nothing is written.
//
// Nothing then runs in the group but raft's snapshot timer. It is woken
// by what needs a leader, on any of its replicas:
//
//   - a write, a linearizable read or a read index (Group.Push,
//     Group.ReadIndex) on a replica that knows no live leader: Awaken
//     starts an election there at once, as a leadership transfer does
//     (TimeoutNow), then puts the replica on the fast timing and waits for
//     a leader. A replica that still names a former leader whose node
//     answers pings leaves it to that one (its caller answers NotLeader
//     naming it, and the client asks there);
//   - a message of a live group (received): a vote it granted, a
//     TimeoutNow, entries, an append of another leader. A heartbeat is
//     not one: its word says what to run;
//   - a leader's node going silent (ExpediteElection, as for any group);
//   - raft leaving the follower state by itself, or its log moving (tick).
//
// Failover is unchanged: a dormant group has no leader to lose, and one
// woken after its former leader's node died elects among the others, as
// soon as someone asks. If nobody asks, its raft timers fire after the
// hour, it elects a leader, and goes dormant again after DormantAfter.
//
// While a replica is dormant, its raft logs at debug level only: its step
// down is a warning and an error in raft's words ("peer has newer term").

const (
	// dormantTimeout is the heartbeat and election timeout of a dormant
	// replica.
	dormantTimeout = time.Hour
	// dormantTick is how often the node's tick looks at a dormant replica:
	// it only looks for raft waking it.
	dormantTick = time.Second
	// awakenWait bounds how long Awaken waits for an election it started.
	awakenWait = 2 * time.Second
	// awakenSilence is how long a former leader's node may have been
	// silent for Awaken to leave the group to it: nodes ping each other
	// every 25 ms (DefaultPingInterval).
	awakenSilence = time.Second
)

// answerDormant answers, for a dormant leader, an append without entries
// as a follower of a later term would, and returns true: raft steps down
// on that answer at once. An append with entries means the log moved: the
// group wakes and the append is sent.
func (t *Transport) answerDormant(args *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) bool {
	if !t.dormant.Load() {
		return false
	}
	if len(args.Entries) > 0 {
		if q := t.quiet.Load(); q != nil {
			q.wake()
		}
		return false
	}
	*resp = raft.AppendEntriesResponse{
		RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax},
		Term:      args.Term + 1,
		Success:   false,
	}
	t.mux.stats.DormantAnswers.Add(1)
	return true
}

// received wakes a dormant replica for a message its raft accepted (cmd,
// answered with resp) that only a live group sends.
func (t *Transport) received(cmd, resp any) {
	if !t.dormant.Load() {
		return
	}
	q := t.quiet.Load()
	if q == nil {
		return
	}
	wake := false
	switch c := cmd.(type) {
	case *raft.AppendEntriesRequest:
		r, ok := resp.(*raft.AppendEntriesResponse)
		if !ok || !r.Success || isHeartbeat(c) {
			return
		}
		q.mu.Lock()
		other := raft.ServerAddress(c.RPCHeader.Addr) != q.quietLeader || c.Term != q.seenTerm
		q.mu.Unlock()
		wake = len(c.Entries) > 0 || other
	case *raft.RequestVoteRequest:
		r, ok := resp.(*raft.RequestVoteResponse)
		wake = ok && r.Granted
	case *raft.TimeoutNowRequest:
		wake = true
	case *raft.InstallSnapshotRequest:
		wake = true
	}
	if wake {
		q.wake()
	}
}

// Dormant says whether the replica is dormant now: it has no leader, and
// its raft no running timer.
func (r *RaftReplica) Dormant() bool {
	if r.quiet == nil {
		return false
	}
	return r.quiet.transport.dormant.Load() || r.awakening.Load()
}

// Awaken makes a dormant replica's group live again for a request that
// needs its leader, and returns once it has one (this replica or
// another), the election failed, or ctx ends; it returns at once if the
// replica is not dormant, or if it names a former leader whose node is
// alive (that one wakes the group when asked). Concurrent calls start one
// election.
func (r *RaftReplica) Awaken(ctx context.Context) {
	if !r.Dormant() {
		return
	}
	r.awakenMu.Lock()
	defer r.awakenMu.Unlock()
	q := r.quiet
	if !q.transport.dormant.Load() {
		return // woken while this call waited for the one before
	}
	r.awakening.Store(true)
	defer r.awakening.Store(false)
	if r.Raft.State() == raft.Leader {
		// Dormant, not yet stepped down.
		q.wake()
		return
	}
	t := q.transport
	now := time.Now()
	addr, id := r.Raft.LeaderWithID()
	if addr != "" && id != r.cfg.NodeID {
		if heard, ok := t.mux.LastHeard(addr); ok && now.Sub(heard) < awakenSilence {
			return
		}
	}
	if !r.reachesMajority(id, now, awakenSilence) {
		return
	}
	tctx, cancel := context.WithTimeout(ctx, time.Second)
	_, err := t.deliver(tctx, &raft.TimeoutNowRequest{RPCHeader: raft.RPCHeader{
		ProtocolVersion: raft.ProtocolVersionMax, ID: []byte(r.cfg.NodeID), Addr: []byte(t.LocalAddr())}}, nil)
	cancel()
	// After the TimeoutNow, not before: woken first, raft's follower timer
	// would fire at once (its leader's last contact is as old as the
	// dormancy) and start an election with pre-vote, which a follower
	// that still names the former leader refuses. Woken now, the
	// candidate's election timer is the fast one.
	q.wake()
	if err != nil {
		r.cfg.Logger.Info("waking a dormant group", "group", r.cfg.ID, "error", err)
		return
	}
	t.mux.stats.DormantWakes.Add(1)
	deadline := time.NewTimer(awakenWait)
	defer deadline.Stop()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		if r.Raft.State() == raft.Leader {
			return
		}
		if a, _ := r.Raft.LeaderWithID(); a != "" {
			return
		}
		select {
		case <-tick.C:
		case <-deadline.C:
			return
		case <-ctx.Done():
			return
		}
	}
}

// Awaken is RaftReplica.Awaken for the group's replica; as leader, it
// also waits until the replica may serve reads (readyTerm), for at most
// awakenWait. Push and ReadIndex call it; so do the node's other requests
// that need a leader (membership changes, a bounded read's lease).
func (g *Group) Awaken(ctx context.Context) {
	if !g.replica.Dormant() {
		return
	}
	g.replica.Awaken(ctx)
	deadline := time.Now().Add(awakenWait)
	for g.raft.State() == raft.Leader && g.readyTerm.Load() != g.raft.CurrentTerm() && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(time.Millisecond)
	}
}

// LeaderHint is the leader this replica names (raft's LeaderWithID), or
// for a dormant replica that names none (the one that stepped down) the
// replica itself: asked for a leader, it wakes the group with an election
// it is the likeliest to win, its log being the longest.
func (g *Group) LeaderHint() (raft.ServerAddress, raft.ServerID) {
	addr, id := g.raft.LeaderWithID()
	if addr == "" && g.Dormant() {
		if t, ok := g.cfg.Transport.(*Transport); ok {
			return t.LocalAddr(), g.cfg.NodeID
		}
	}
	return addr, id
}

// VotersHeard says whether this node heard, within the last within, from
// the node of every voter of the group but this replica: for a dormant
// replica, that the group is still asleep (a woken one's leader would
// have sent it something through those links), so what it applied is
// still all there is.
func (r *RaftReplica) VotersHeard(within time.Duration) bool {
	t, ok := r.cfg.Transport.(*Transport)
	if !ok {
		return false
	}
	others, ok := r.otherVoters("")
	if !ok {
		return false
	}
	now := time.Now()
	for _, s := range others {
		if heard, ok := t.mux.LastHeard(s.Address); !ok || now.Sub(heard) > within {
			return false
		}
	}
	return true
}

// DormantFresh says whether this replica is dormant and its group still
// asleep (VotersHeard within), so that it may serve an eventual read
// although no leader has contacted it for long.
func (g *Group) DormantFresh(within time.Duration) bool {
	return g.replica.Dormant() && g.replica.VotersHeard(within)
}

// touch notes a read that needed this replica's leadership: a group read
// that way is in use, and does not go dormant (only quiet) while it is.
func (r *RaftReplica) touch() {
	if r.quiet != nil && r.quiet.dormantAfter > 0 {
		r.quiet.usedAt.Store(time.Now().UnixNano())
	}
}

// Dormant is RaftReplica.Dormant for the group's replica.
func (g *Group) Dormant() bool { return g.replica.Dormant() }

// dormantLogger is a replica's raft logger, at debug level only while the
// replica is dormant.
type dormantLogger struct {
	hclog.Logger
	t *Transport
}

func (l dormantLogger) Log(level hclog.Level, msg string, args ...any) {
	if level > hclog.Debug && l.t.dormant.Load() {
		level = hclog.Debug
	}
	l.Logger.Log(level, msg, args...)
}

func (l dormantLogger) Info(msg string, args ...any)  { l.Log(hclog.Info, msg, args...) }
func (l dormantLogger) Warn(msg string, args ...any)  { l.Log(hclog.Warn, msg, args...) }
func (l dormantLogger) Error(msg string, args ...any) { l.Log(hclog.Error, msg, args...) }
