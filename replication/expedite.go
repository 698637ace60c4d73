package replication

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
)

// Expedited elections.
//
// hashicorp/raft's follower checks for a silent leader on a timer that fires
// every [HeartbeatTimeout, 2×HeartbeatTimeout], so it notices a dead leader
// between 1 and 3 heartbeat timeouts after the last heartbeat (about 1.8 on
// average), and a node that led several shards leaves each unavailable for
// a different draw of that delay: a client writing to all of them waits for
// the slowest. ExpediteElection lets the node check every group it holds on
// one fine-grained ticker and start the election itself once the leader's
// node has been silent for a fixed time, turning the wait into "silence +
// one tick" for every group alike.
//
// Two guards keep it from deposing a leader that is alive:
//   - the silence must be of the leader's whole node (Mux.LastHeard: any
//     message of any group, or an answer to one), not only of this group,
//     so a leader whose node still talks to us keeps raft's own timing;
//   - followers are staggered by their rank among the group's voters, so
//     the two followers of a 3-replica group do not split the vote.
//
// The election is started as raft starts one for a leadership transfer (a
// TimeoutNow request, handed to this replica's own raft): the other
// follower grants the vote although it may not have noticed the silence
// yet. That is what makes it fast, and it is safe in raft's sense (votes
// still require an up-to-date log, terms still only grow); the price is
// that a follower cut off from a living leader while still reaching the
// other follower can depose it, which raft's pre-vote would have refused.

// expedited counts elections this package started early, for tests and metrics.
var expedited atomic.Int64

// ExpeditedElections returns how many elections ExpediteElection started in
// this process.
func ExpeditedElections() int64 { return expedited.Load() }

// ExpediteElection starts an election on this replica now if it is a voting
// follower that knows a leader, this group has not heard from the leader for
// silence plus a stagger (silence/2 per voter ranked before this one, ranked
// by ID among the voters other than the leader), and this node has not heard
// from the leader's node at all for as long. It returns whether it started
// one. It does nothing for a replica whose transport is not a Mux's. Call it
// often (every tenth of the heartbeat timeout, say); it is cheap.
func (g *Group) ExpediteElection(silence time.Duration) (bool, error) {
	return g.replica.ExpediteElection(silence)
}

// ExpediteElection is Group.ExpediteElection for any Raft replica (the
// metadata group's too).
func (r *RaftReplica) ExpediteElection(silence time.Duration) (bool, error) {
	t, ok := r.cfg.Transport.(*Transport)
	if !ok || silence <= 0 {
		return false, nil
	}
	if r.Raft.State() != raft.Follower {
		return false, nil
	}
	leaderAddr, leaderID := r.Raft.LeaderWithID()
	now := time.Now()
	if leaderAddr != "" {
		if p := r.lastLeader.Load(); p == nil || p.addr != leaderAddr || p.id != leaderID {
			r.lastLeader.Store(&seenLeader{addr: leaderAddr, id: leaderID})
		}
		r.leaderSeen.Store(now.UnixNano())
	} else {
		// No leader known. A replica that never followed one (fresh, or
		// just restarted) leaves it to raft's timer. One that followed a
		// leader until a moment ago has lost it to another replica's
		// election: if that election failed (its candidate's log was
		// behind this one's), nobody else would start one before raft's
		// timer fires, a whole group heartbeat timeout later, so the dead
		// leader is judged as if still known. An election that succeeded
		// made a leader that contacts this replica at once. A replica that
		// lost its leader longer ago, to its own raft timer while it was
		// cut off, is left to raft too: when the cut heals, the leader's
		// node is still silent to it for a moment while the others answer
		// again, and an election then would depose a living leader.
		p := r.lastLeader.Load()
		if p == nil || now.Sub(time.Unix(0, r.leaderSeen.Load())) > silence {
			return false, nil
		}
		leaderAddr, leaderID = p.addr, p.id
	}
	last := r.Raft.LastContact()
	if last.IsZero() {
		return false, nil
	}
	rank, voter := r.voterRank(leaderID)
	if !voter {
		return false, nil
	}
	if r.refusedShorterLog(t, now, silence) {
		// The stagger keeps two followers from splitting the vote; the
		// other one has tried, and only this one can win.
		rank = 0
	}
	wait := silence + time.Duration(rank)*silence/2
	heard, heardOK := t.mux.LastHeard(leaderAddr)
	if now.Sub(last) < wait || (heardOK && now.Sub(heard) < wait) {
		if !heardOK || now.Sub(heard) >= silence/2 {
			// Start pinging the other voters' nodes now, so that by the
			// silence their answers make the streak reachesMajority asks
			// for: two followers that share no group as leader and
			// follower exchange no message, and watched only once the
			// silence was reached, the election waited 100-150 ms more.
			r.watchVoters(leaderID)
		}
		return false, nil
	}
	// The leader's node is silent. Whether or not the election below
	// starts, a quiet replica goes back to the fast timing: where this
	// election may not start, raft's own timer (and pre-vote) takes over
	// within a fast heartbeat timeout, not the quiet timer's seconds.
	// Deferred, so that an election started below wakes the replica after
	// its TimeoutNow, not before: woken first, its own timer would fire
	// and start an election with pre-vote, not as a transfer, which the
	// other follower, still following the dead leader, refuses; woken
	// after, the candidate retries on the fast timer if this one fails.
	defer r.Wake()
	if !r.reachesMajority(leaderID, now, silence) {
		// Cut off ourselves: an election without pre-vote would only
		// raise our term, and at the heal depose a leader that lives.
		return false, nil
	}
	term := r.Raft.CurrentTerm()
	if r.expeditedTerm.Load() >= term {
		// Once per term: if this election fails, raft's timers go on.
		return false, nil
	}
	r.expeditedTerm.Store(term)
	r.cfg.Logger.Info("leader's node silent; starting an election now", "group", r.cfg.ID,
		"leader", leaderAddr, "silent", now.Sub(last).Round(time.Millisecond), "term", term)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	// Raft may have changed state since the check above; TimeoutNow would
	// then make a leader campaign again. The window is a few instructions
	// of raft's main loop, and the worst outcome is one more election.
	if _, err := t.deliver(ctx, &raft.TimeoutNowRequest{RPCHeader: raft.RPCHeader{
		ProtocolVersion: raft.ProtocolVersionMax, ID: []byte(r.cfg.NodeID), Addr: []byte(t.LocalAddr())}}, nil); err != nil {
		return false, fmt.Errorf("group %s: starting an election: %w", r.cfg.ID, err)
	}
	expedited.Add(1)
	return true, nil
}

// refusedVote is a transfer vote a replica refused: when, and the
// candidate's last log entry.
type refusedVote struct {
	at                  time.Time
	lastTerm, lastIndex uint64
}

// noteRefusedTransfer records req if it is a transfer vote (LeadershipTransfer:
// what an expedited election asks for) that this replica's raft refused.
func (t *Transport) noteRefusedTransfer(req, resp any) {
	v, ok := req.(*raft.RequestVoteRequest)
	if !ok || !v.LeadershipTransfer {
		return
	}
	if a, ok := resp.(*raft.RequestVoteResponse); ok && !a.Granted {
		t.refusedTransfer.Store(&refusedVote{at: time.Now(), lastTerm: v.LastLogTerm, lastIndex: v.LastLogIndex})
	}
}

// refusedShorterLog says whether this replica refused, within the last
// silence, a transfer vote to a candidate whose log ends before its own:
// the other follower's expedited election failed for its log (it lacked
// the dead leader's last entries), and this replica, which has them, is
// the one that can win. Without it, it waited out its rank's stagger
// (half a silence more), a third of the failover.
func (r *RaftReplica) refusedShorterLog(t *Transport, now time.Time, silence time.Duration) bool {
	v := t.refusedTransfer.Load()
	if v == nil || now.Sub(v.at) > silence {
		return false
	}
	stats := r.Raft.Stats()
	term, err1 := strconv.ParseUint(stats["last_log_term"], 10, 64)
	index, err2 := strconv.ParseUint(stats["last_log_index"], 10, 64)
	if err1 != nil || err2 != nil {
		return false
	}
	return term > v.lastTerm || (term == v.lastTerm && index > v.lastIndex)
}

// reachesMajority says whether this node hears (Mux.hearing)
// the nodes of enough voters other than leader to make a majority with
// this replica: raft's pre-vote asks the same of a candidate, and the
// election ExpediteElection starts skips it.
func (r *RaftReplica) reachesMajority(leader raft.ServerID, now time.Time, silence time.Duration) bool {
	t, ok := r.cfg.Transport.(*Transport)
	if !ok {
		return false
	}
	f := r.Raft.GetConfiguration()
	if f.Error() != nil {
		return false
	}
	voters, reached := 0, 0
	for _, s := range f.Configuration().Servers {
		if s.Suffrage != raft.Voter {
			continue
		}
		voters++
		switch {
		case s.ID == r.cfg.NodeID:
			reached++
		case s.ID == leader:
		default:
			if t.mux.hearing(s.Address, now, silence) {
				reached++
			} else {
				t.mux.watch(s.Address)
			}
		}
	}
	return reached > voters/2
}

// watchVoters makes the Mux ping the nodes of this group's voters other
// than leader and this replica (Mux.watch).
func (r *RaftReplica) watchVoters(leader raft.ServerID) {
	t, ok := r.cfg.Transport.(*Transport)
	if !ok {
		return
	}
	others, _ := r.otherVoters(leader)
	for _, s := range others {
		t.mux.watch(s.Address)
	}
}

// otherVoters returns the group's voters in its latest configuration but
// this replica and skip (none if empty), and false if raft could not say.
func (r *RaftReplica) otherVoters(skip raft.ServerID) ([]raft.Server, bool) {
	f := r.Raft.GetConfiguration()
	if f.Error() != nil {
		return nil, false
	}
	var out []raft.Server
	for _, s := range f.Configuration().Servers {
		if s.Suffrage == raft.Voter && s.ID != r.cfg.NodeID && (skip == "" || s.ID != skip) {
			out = append(out, s)
		}
	}
	return out, true
}

// hearing says whether this node hears peer's node now: it heard from it
// within half the silence, and (with pings on) without a gap for at least
// four ping intervals.
//
// Half, because the leader's node must have been silent for the whole
// silence: when this node itself is cut off, every peer goes quiet at
// the same moment, and the leader's last message may simply be older than
// the other follower's by a few milliseconds. With the full silence for
// both, the cut-off node saw the leader silent while the other follower's
// last message was still "recent", started an election it could not win,
// and the term it raised deposed the living leader when the cut healed (a
// chaos run with 2 s group heartbeats: 2 s without linearizable reads). A
// live follower that this node pings answers every ping interval, well
// within half the silence.
//
// The streak is for a node whose own cut just healed:
// its peers' messages arrive again one by one, and for a moment it hears
// the other followers but not yet the leader's node, which looks exactly
// like a leader that died while the followers talked. Each live peer that
// this node pings answers within one ping interval, so by the time a new
// streak counts the leader's node has been heard too, and it is not silent.
func (m *Mux) hearing(peer raft.ServerAddress, now time.Time, silence time.Duration) bool {
	heard, ok := m.LastHeard(peer)
	if !ok || now.Sub(heard) >= silence/2 {
		return false
	}
	gap := m.heardGap()
	if gap == 0 {
		return true
	}
	since, _ := m.heardSince(peer)
	return now.Sub(since) >= gap
}

// voterRank is this replica's position among the group's voters other than
// leader, ordered by ID, and whether it is a voter at all.
func (r *RaftReplica) voterRank(leader raft.ServerID) (int, bool) {
	f := r.Raft.GetConfiguration()
	if f.Error() != nil {
		return 0, false
	}
	var ids []raft.ServerID
	self := false
	for _, s := range f.Configuration().Servers {
		if s.Suffrage != raft.Voter || s.ID == leader {
			continue
		}
		ids = append(ids, s.ID)
		if s.ID == r.cfg.NodeID {
			self = true
		}
	}
	if !self {
		return 0, false
	}
	slices.Sort(ids)
	return slices.Index(ids, r.cfg.NodeID), true
}

// campaignFirst starts the first election of a group just bootstrapped,
// on the replica whose ID is the lowest of the voters: without it, a new
// group waits a heartbeat timeout or two for raft's timer (1–2 s at shard
// groups' default), and a table is not ready before every shard has a
// leader. Its peers' transports wait for their replica to open
// (lookupWait), so the votes it asks for are answered once they have.
func (r *RaftReplica) campaignFirst() {
	t, ok := r.cfg.Transport.(*Transport)
	if !ok {
		return
	}
	first := raft.ServerID("")
	for _, s := range r.cfg.Peers {
		if s.Suffrage == raft.Voter && (first == "" || s.ID < first) {
			first = s.ID
		}
	}
	if first != r.cfg.NodeID {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if _, err := t.deliver(ctx, &raft.TimeoutNowRequest{RPCHeader: raft.RPCHeader{
		ProtocolVersion: raft.ProtocolVersionMax, ID: []byte(r.cfg.NodeID), Addr: []byte(t.LocalAddr())}}, nil); err != nil {
		r.cfg.Logger.Info("starting the first election", "group", r.cfg.ID, "error", err)
	}
}
