package replication

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
)

// Quiescence: idle groups on a slow clock.
//
// Node pings and idle appends answered locally (transport_idle.go) took
// the network out of an idle group's cost, but not raft's own clocks: a
// leader heartbeats each follower every tenth of the heartbeat timeout,
// and each heartbeat is still a message encoded, batched, sent, decoded
// and handed to the follower's raft. hashicorp/raft cannot stop its timers,
// but it can change them while it runs (Raft.ReloadConfig: the heartbeat
// and election timeouts). A group that has written nothing for
// RaftConfig.QuietAfter switches to QuietHeartbeatTimeout (seconds): its
// leader heartbeats a few times a second at most and its followers'
// timers allow for it. Failover does not wait for those timers: a dead
// leader's node stops answering node pings, and ExpediteElection starts
// the election after the same silence as for a busy group.
//
// The switch is the leader's, and its followers agree before it slows
// down. Each heartbeat carries a timing word (transportpb.RPC.Timing): the
// leader's epoch, counted up at every change, and a bit asking for the
// quiet timing. A follower that accepts the heartbeat switches its own
// timers to what the word asks and answers with the word it now runs.
// The leader slows its heartbeats only once every follower it heartbeats
// answered the quiet word of the current epoch; a follower on the fast
// timer never waits for a leader on the slow one. Back the other way,
// the leader speeds up first: when its log moves (a write, a membership
// change) its next tick reloads the fast timing, which makes raft send
// every follower a heartbeat at once, and those carry the word that
// wakes the followers. Epochs keep an older word that arrives late (a
// heartbeat batch overtaken by the next one) from undoing a newer one.
//
// Anything but a follower of a steady leader runs the fast timing: a
// candidate (its election retries in milliseconds, not seconds), a
// follower whose leader changed, a leader that hands over
// (Group.TransferLeadership: a transfer that fails is abandoned after the
// election timeout) and a replica whose leader's node fell silent
// (ExpediteElection).
//
// A group quiet for DormantAfter more goes dormant (transport_dormant.go):
// the same word, with the dormant bit, puts its followers on timers of an
// hour, and once all answered it the leader steps down. No replica of a
// dormant group runs a timer that fires.
//
// Concurrency: tick runs on the node's timing loop; follow on the
// goroutines answering heartbeats; sent and acked on the senders'. mu
// guards everything but word, which heartbeats read without it.
type quiescence struct {
	raft         *raft.Raft
	transport    *Transport
	after        time.Duration
	dormantAfter time.Duration // 0: never dormant
	fast         time.Duration // the group's heartbeat timeout
	election     time.Duration // the group's election timeout
	slow         time.Duration // QuietHeartbeatTimeout: both, while quiet
	logger       hclog.Logger

	// word is what this replica's heartbeats carry: 0 while it does not
	// lead (so it also says whether it leads), else epoch<<wordEpochShift
	// | the timing it asks for (wordQuiet, or wordDormant).
	word atomic.Uint64
	// restUntil (Unix nanoseconds): a quiet replica's ticks before it
	// return at once. Read without mu, like word.
	restUntil atomic.Int64
	// usedAt (Unix nanoseconds): the last read that needed this leader
	// (ReadIndex). A group read that way does not go dormant: each read
	// after would wake it with an election.
	usedAt atomic.Int64

	mu     sync.Mutex
	timing uint64 // what raft runs now: timingFast, wordQuiet or wordDormant
	closed bool
	// The last index seen and when it moved (leader and follower), and
	// the leader's epoch.
	lastIndex uint64
	movedAt   time.Time
	epoch     uint64
	// acks is, per follower heartbeated since the log last moved, the
	// last word it answered.
	acks map[raft.ServerAddress]uint64
	// As follower: the newest word accepted (its term and epoch), and
	// the leader that sent it.
	seenTerm, seenEpoch uint64
	quietLeader         raft.ServerAddress
}

// The timing a word asks for, in its low bits; the leader's epoch above.
const (
	timingFast     = 0
	wordQuiet      = 1             // the quiet timing
	wordDormant    = 2 | wordQuiet // dormancy: quiet, and more
	wordTiming     = wordDormant   // the mask of both
	wordEpochShift = 2
)

// setTiming switches raft's timers to timing (timingFast, wordQuiet or
// wordDormant). Called with mu held.
//
// Shortening the timers makes a follower's raft check its leader's last
// contact at once, and start an election if that is older than the new
// heartbeat timeout: whoever wakes a dormant follower does so once raft
// accepted a message of a live leader or a vote (which refresh the
// contact), or right after handing it a TimeoutNow.
func (q *quiescence) setTiming(timing uint64) {
	if q.timing == timing || q.closed {
		return
	}
	rc := q.raft.ReloadableConfig()
	switch timing {
	case timingFast:
		rc.HeartbeatTimeout, rc.ElectionTimeout = q.fast, q.election
	case wordQuiet:
		rc.HeartbeatTimeout, rc.ElectionTimeout = q.slow, max(q.slow, q.election)
	default:
		rc.HeartbeatTimeout, rc.ElectionTimeout = dormantTimeout, dormantTimeout
	}
	if err := q.raft.ReloadConfig(rc); err != nil {
		// Only an invalid config fails, and all were validated at open.
		q.logger.Warn("switching raft timing", "timing", timing, "error", err)
		return
	}
	q.transport.setHeartbeatTimeout(rc.HeartbeatTimeout)
	q.timing = timing
	q.transport.dormant.Store(timing == wordDormant)
	if timing == timingFast {
		q.restUntil.Store(0)
	}
}

// tick moves the replica between the timings; the node calls it for each
// group a few times per fast heartbeat timeout. A quiet replica looks
// only every half fast heartbeat timeout: all it looks for is its log
// moving or its leader changing, and noticing those a few ticks later
// costs nothing but a little more time on the slow timing, while its
// failover does not wait for timing at all (ExpediteElection); the node
// ticks every group fifty times a second, and most of an idle node's
// groups are quiet.
func (q *quiescence) tick(now time.Time) {
	if now.UnixNano() < q.restUntil.Load() {
		return
	}
	state := q.raft.State()
	index := q.raft.LastIndex()
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return
	}
	defer func() {
		switch q.timing {
		case wordQuiet:
			q.restUntil.Store(now.Add(q.fast / 2).UnixNano())
		case wordDormant:
			q.restUntil.Store(now.Add(dormantTick).UnixNano())
		}
	}()
	if state != raft.Leader {
		q.stopLeading()
		moved := index != q.lastIndex
		if moved {
			q.lastIndex, q.movedAt = index, now
		}
		if q.timing == wordDormant {
			// Dormant: no leader, or a leader that is stepping down.
			// Raft itself left the follower state (a TimeoutNow, an
			// election) or took entries: the group lives again.
			if state != raft.Follower || moved {
				q.setTiming(timingFast)
			}
			return
		}
		if q.timing == wordQuiet {
			// A follower whose log moved wakes without waiting for its
			// leader's word: if that entry removes the leader (which then
			// steps down), no word may come, and the group would wait for
			// the slow timer.
			if addr, _ := q.raft.LeaderWithID(); state != raft.Follower || addr != q.quietLeader || moved {
				q.setTiming(timingFast)
			}
		}
		return
	}
	if q.word.Load() == 0 || index != q.lastIndex {
		// A new leadership, or the log moved.
		q.lastIndex = index
		q.busy(now)
		return
	}
	next := uint64(wordQuiet)
	switch {
	case now.Sub(q.movedAt) < q.after || q.timing == wordDormant:
		return
	case q.timing == wordQuiet:
		used := max(q.movedAt.UnixNano(), q.usedAt.Load())
		if q.dormantAfter <= 0 || now.Sub(time.Unix(0, used)) < q.after+q.dormantAfter {
			return
		}
		next = wordDormant
	}
	w := q.word.Load()
	if w&wordTiming != next {
		q.announce(next)
		return
	}
	if len(q.acks) == 0 {
		return // no follower heartbeated: nothing to slow down
	}
	for _, a := range q.acks {
		if a != w {
			return
		}
	}
	// Every follower runs the timing asked for. Dormant, this leader's
	// transport answers its next idle append as a follower of a later
	// term would, and raft steps down (transport_dormant.go).
	q.setTiming(next)
}

// resetAcks forgets the followers' answers; a busy leader does this at
// every tick, so the map is reused. Called with mu held.
func (q *quiescence) resetAcks() {
	if q.acks == nil {
		q.acks = map[raft.ServerAddress]uint64{}
	}
	clear(q.acks)
}

// busy puts this leader's group on the fast timing as of now: its
// heartbeats ask followers for it (the reload makes raft send them at
// once), and the idle time is counted afresh. Called with mu held.
func (q *quiescence) busy(now time.Time) {
	q.movedAt = now
	q.resetAcks()
	q.announce(timingFast)
	q.setTiming(timingFast)
}

// announce makes this leader's heartbeats ask for timing (timingFast,
// wordQuiet or wordDormant) in a new epoch, unless they already do.
// Called with mu held.
func (q *quiescence) announce(timing uint64) {
	if w := q.word.Load(); w != 0 && w&wordTiming == timing {
		return
	}
	q.epoch++
	q.word.Store(q.epoch<<wordEpochShift | timing)
}

// stopLeading: the replica follows (or is closing), so its heartbeats
// carry nothing and it counts no answers. Called with mu held.
func (q *quiescence) stopLeading() {
	q.word.Store(0)
	q.acks = nil
}

// wake puts the replica on the fast timing now, for what follows (an
// election it starts, a leadership transfer); as leader its followers
// too.
func (q *quiescence) wake() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.word.Load() != 0 {
		q.busy(time.Now())
		return
	}
	q.setTiming(timingFast)
}

// sent notes that a heartbeat of this leader's went to target, and
// returns the word it carries.
func (q *quiescence) sent(target raft.ServerAddress) uint64 {
	w := q.word.Load()
	if w == 0 {
		return 0
	}
	q.mu.Lock()
	if q.acks != nil {
		if _, ok := q.acks[target]; !ok {
			q.acks[target] = 0
		}
	}
	q.mu.Unlock()
	return w
}

// acked notes the word target answered a heartbeat with.
func (q *quiescence) acked(target raft.ServerAddress, w uint64) {
	q.mu.Lock()
	if q.acks != nil {
		q.acks[target] = w
	}
	q.mu.Unlock()
}

// follow applies the word of a heartbeat this follower accepted (of
// leader's, in term) and returns the word it runs now, for the answer: 0
// if it ignored the word as older than one it already followed.
func (q *quiescence) follow(term uint64, leader raft.ServerAddress, w uint64) uint64 {
	epoch := w >> wordEpochShift
	q.mu.Lock()
	defer q.mu.Unlock()
	// It accepted a leader's heartbeat: it follows now, whatever the
	// last tick saw.
	q.stopLeading()
	if term < q.seenTerm || (term == q.seenTerm && epoch < q.seenEpoch) {
		return 0
	}
	q.seenTerm, q.seenEpoch = term, epoch
	q.quietLeader = leader
	if w&wordQuiet != 0 && time.Since(q.movedAt) < q.after/2 {
		// Still catching up (its log moved lately): it would wake at
		// the next entry and go quiet again at the next word, and a
		// leader that counted its answer could slow down just as it
		// woke. Not yet; the leader waits.
		return 0
	}
	q.setTiming(w & wordTiming)
	return w
}

// followTiming applies the timing word w of a heartbeat this follower
// answered with resp, and returns the word for the answer.
func (t *Transport) followTiming(req, resp any, w uint64) uint64 {
	q := t.quiet.Load()
	hb, ok := req.(*raft.AppendEntriesRequest)
	ans, ok2 := resp.(*raft.AppendEntriesResponse)
	if q == nil || !ok || !ok2 || !ans.Success || !isHeartbeat(hb) {
		return 0
	}
	return q.follow(hb.Term, raft.ServerAddress(hb.RPCHeader.Addr), w)
}

// idleRefresh is how long an idle append may be answered from memory
// (transport_idle.go): on the quiet timing, as long as a quiet heartbeat
// timeout, since nothing is being written that a lost follower would
// miss for longer.
func (t *Transport) idleRefresh() time.Duration {
	r := t.mux.cfg.IdleAppendRefresh
	if q := t.quiet.Load(); q != nil && q.word.Load()&wordQuiet != 0 {
		r = max(r, q.slow)
	}
	return r
}

// close stops the switching; the replica is closing.
func (q *quiescence) close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.timing = timingFast
	q.transport.dormant.Store(false)
	q.closed = true
	q.stopLeading()
}

// Tick moves the replica between its fast and quiet timing
// (RaftConfig.QuietAfter); the node calls it for every group several times
// per heartbeat timeout. It does nothing for a replica without quiescence.
func (r *RaftReplica) Tick(now time.Time) {
	if r.quiet != nil {
		r.quiet.tick(now)
	}
}

// Wake puts the replica, and if it leads its followers, on the fast
// timing (ExpediteElection, TransferLeadership).
func (r *RaftReplica) Wake() {
	if r.quiet != nil {
		r.quiet.wake()
	}
}

// Quiet says whether the replica runs the quiet timing now.
func (r *RaftReplica) Quiet() bool {
	if r.quiet == nil {
		return false
	}
	r.quiet.mu.Lock()
	defer r.quiet.mu.Unlock()
	return r.quiet.timing != timingFast
}

// Tick is RaftReplica.Tick for the group's replica.
func (g *Group) Tick(now time.Time) { g.replica.Tick(now) }

// TransferLeadership hands this leader's group to the voter id at addr,
// or to the most up-to-date voter if id is empty, on the fast timing: raft
// abandons a transfer that has not succeeded within the election timeout,
// and refuses writes until then, which on the quiet timing would be
// seconds. Every leadership transfer goes through here (the metadata
// group's too).
func (r *RaftReplica) TransferLeadership(id raft.ServerID, addr raft.ServerAddress) raft.Future {
	r.Wake()
	if id == "" {
		return r.Raft.LeadershipTransfer()
	}
	return r.Raft.LeadershipTransferToServer(id, addr)
}

// TransferLeadership is RaftReplica.TransferLeadership for the group's
// replica.
func (g *Group) TransferLeadership(id raft.ServerID, addr raft.ServerAddress) raft.Future {
	return g.replica.TransferLeadership(id, addr)
}

// Quiet is RaftReplica.Quiet for the group's replica.
func (g *Group) Quiet() bool { return g.replica.Quiet() }
