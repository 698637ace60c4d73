package replication

import (
	"context"
	"sync"
	"time"

	"github.com/hashicorp/raft"
	"github.com/raftps/raftps/replication/transportpb"
)

// What an idle group costs.
//
// hashicorp/raft runs its timers inside each group: a leader sends each
// follower a heartbeat every tenth of the heartbeat timeout and an
// AppendEntries every commit timeout, whether or not anything is written.
// Each is a message encoded, sent, decoded and handed to the follower's
// raft: about 1.7 % of a core per idle replica (docs/BENCHMARKS.md, "Idle
// cost of Raft groups"). Two things here make an idle group nearly free:
//
//   - Node pings (pingLoop). The Mux pings every peer it has heard from,
//     every PingInterval, unless it heard from that peer during the
//     interval anyway: one empty Heartbeats message per peer, whatever the
//     number of groups. LastHeard stays fresh while a peer lives, so
//     failover can be driven by node liveness (ExpediteElection) and shard
//     groups can run a long heartbeat timeout.
//   - Idle appends answered locally (idleAppends). An AppendEntries
//     without entries that is identical (term, previous entry, commit
//     index) to one the follower accepted less than IdleAppendRefresh ago
//     tells the follower nothing: the leader's transport answers it with
//     the follower's earlier answer instead of sending it. Raft's
//     correctness never rests on these messages (they carry only the
//     commit index, and a new commit index makes the next one differ, so
//     it is sent). Two conditions keep the answer honest for what raft
//     reads into it: raft takes a successful answer as contact with the
//     follower (the leader lease) and as a vote that it still leads
//     (VerifyLeader), so it is given only while this node has heard from
//     the follower's node within IdleAppendFresh; and a follower that lost
//     its state without its node going silent (a replica removed and added
//     again) is repaired at the latest when the refresh interval sends the
//     append for real.

// Defaults of the idle-cost settings of a Mux.
const (
	DefaultPingInterval      = 25 * time.Millisecond
	DefaultIdleAppendRefresh = time.Second
	DefaultHeartbeatDelay    = 20 * time.Millisecond
)

// pingForget is how long the Mux goes on pinging a peer it no longer hears
// from: a node that left the cluster is not pinged for ever.
const pingForget = time.Minute

// pingLoop pings the peers this node has heard from within pingForget and
// not within the last interval, each with at most one ping in flight.
func (m *Mux) pingLoop(interval time.Duration) {
	defer m.wg.Done()
	t := time.NewTicker(interval)
	defer t.Stop()
	var inflight sync.Map // raft.ServerAddress → struct{}
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
		}
		now := time.Now().UnixNano()
		m.heard.Range(func(k, v any) bool {
			peer := k.(raft.ServerAddress)
			age := time.Duration(now - v.(*peerHeard).last.Load())
			if age < interval || age > pingForget {
				return true
			}
			if _, busy := inflight.LoadOrStore(peer, struct{}{}); busy {
				return true
			}
			go func() {
				defer inflight.Delete(peer)
				m.ping(peer)
			}()
			return true
		})
	}
}

// ping sends peer an empty heartbeat batch and notes the answer.
func (m *Mux) ping(peer raft.ServerAddress) {
	c, err := m.client(peer)
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(m.stopCtx, m.cfg.HeartbeatTimeout)
	defer cancel()
	if _, err := c.Heartbeats(ctx, &transportpb.HeartbeatBatch{}); err == nil {
		m.heardFrom(peer)
		m.stats.Pings.Add(1)
	}
}

// idleKey is what makes two AppendEntries without entries the same message
// to a follower.
type idleKey struct {
	term, prevIndex, prevTerm, commit uint64
}

func idleKeyOf(r *raft.AppendEntriesRequest) (idleKey, bool) {
	if len(r.Entries) != 0 {
		return idleKey{}, false
	}
	return idleKey{r.Term, r.PrevLogEntry, r.PrevLogTerm, r.LeaderCommitIndex}, true
}

// idleAppends remembers, per follower of one group, the last AppendEntries
// without entries that the follower accepted, and answers the same one
// again from memory (see "What an idle group costs" above).
//
// Concurrency: mu guards last; a group's replicator and its pipeline call
// it for the same follower from different goroutines.
type idleAppends struct {
	mu   sync.Mutex
	last map[raft.ServerAddress]idleAnswer
}

type idleAnswer struct {
	key  idleKey
	resp raft.AppendEntriesResponse
	sent time.Time
}

// answer fills resp and returns true if req need not be sent to target.
func (t *Transport) answerIdle(target raft.ServerAddress, req *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) bool {
	cfg := &t.mux.cfg
	if cfg.IdleAppendRefresh <= 0 || t.eager.Load() {
		return false
	}
	key, ok := idleKeyOf(req)
	if !ok {
		return false
	}
	now := time.Now()
	if heard, ok := t.mux.LastHeard(target); !ok || now.Sub(heard) > cfg.IdleAppendFresh {
		return false
	}
	t.idle.mu.Lock()
	a, ok := t.idle.last[target]
	t.idle.mu.Unlock()
	if !ok || a.key != key || now.Sub(a.sent) > t.idleRefresh() {
		return false
	}
	*resp = a.resp
	t.mux.stats.IdleAppendsAnswered.Add(1)
	return true
}

// noteIdle records the follower's answer to req, sent at sent: an accepted
// append without entries is remembered, anything else forgets the last.
func (t *Transport) noteIdle(target raft.ServerAddress, req *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse, sent time.Time, err error) {
	if t.mux.cfg.IdleAppendRefresh <= 0 {
		return
	}
	key, ok := idleKeyOf(req)
	t.idle.mu.Lock()
	defer t.idle.mu.Unlock()
	if !ok || err != nil || !resp.Success || resp.Term != req.Term {
		delete(t.idle.last, target)
		return
	}
	if t.idle.last == nil {
		t.idle.last = map[raft.ServerAddress]idleAnswer{}
	}
	t.idle.last[target] = idleAnswer{key: key, resp: *resp, sent: sent}
}

// SendEagerly makes this transport send every AppendEntries, idle or not,
// and every heartbeat at once in a message of its own: for a group whose
// leader's VerifyLeader must count only answers the followers gave, and
// soon (the metadata group, whose VerifyLeader confirms chain reads), and
// whose heartbeats must not wait behind a batch of other groups' to a
// slow peer.
func (t *Transport) SendEagerly() { t.eager.Store(true) }

// AnySilent reports whether some peer this node heard from within
// pingForget has been silent for at least silence: the only case in which
// ExpediteElection can start an election, so a node that holds many groups
// checks them only then.
func (m *Mux) AnySilent(silence time.Duration) bool {
	now := time.Now().UnixNano()
	silent := false
	m.heard.Range(func(_, v any) bool {
		age := time.Duration(now - v.(*peerHeard).last.Load())
		silent = age >= silence && age <= pingForget
		return !silent
	})
	return silent
}

// watch makes the Mux ping peer, which it may never have heard from (two
// followers of the same leaders exchange no Raft message), without
// counting it as heard: its entry is back-dated half of pingForget, so
// LastHeard says it is silent until it answers.
func (m *Mux) watch(peer raft.ServerAddress) {
	if peer == "" {
		return
	}
	old := time.Now().Add(-pingForget / 2).UnixNano()
	v := new(peerHeard)
	v.last.Store(old)
	if cur, loaded := m.heard.LoadOrStore(peer, v); loaded {
		c := cur.(*peerHeard)
		if prev := c.last.Load(); time.Duration(time.Now().UnixNano()-prev) > pingForget {
			c.last.CompareAndSwap(prev, old)
		}
	}
}

// setHeartbeatTimeout tells the transport its group's heartbeat timeout:
// its periodic heartbeats wait for others (HeartbeatDelay) only if that is
// at most a fiftieth of it (20 ms of the shard groups' 1 s), so that the
// wait never eats much of a leader lease or a follower's patience.
func (t *Transport) setHeartbeatTimeout(hb time.Duration) {
	d := t.mux.cfg.HeartbeatDelay
	t.mayDelay.Store(d > 0 && 50*d <= hb)
}
