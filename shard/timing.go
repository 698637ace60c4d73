package shard

import (
	"time"

	"github.com/hashicorp/raft"
	"github.com/raftps/raftps/replication"
	"github.com/raftps/raftps/shard/api"
)

// A node's Raft timing: the heartbeat and election timeouts of its groups,
// the expedited elections that replace a leader whose node went silent, and
// the config each group is opened with.

// heartbeatTimeout is the Raft heartbeat timeout of this node's groups, the
// default's if the config leaves it unset.
func (n *Node) heartbeatTimeout() time.Duration {
	if hb := n.cfg.Raft.HeartbeatTimeout; hb > 0 {
		return hb
	}
	return replication.DefaultRaftConfig().HeartbeatTimeout
}

// expediteSilence is NodeConfig.ExpediteElection with its default applied
// (negative: off).
func (n *Node) expediteSilence() time.Duration {
	if s := n.cfg.ExpediteElection; s != 0 {
		return s
	}
	return n.heartbeatTimeout()
}

// chainSilence is NodeConfig.ChainSilence with its default applied.
func (n *Node) chainSilence() time.Duration {
	if s := n.cfg.ChainSilence; s != 0 {
		return s
	}
	return max(2*n.heartbeatTimeout(), 500*time.Millisecond)
}

// expediteLoop checks every shard replica on this node, and its metadata
// replica, for a silent leader a tenth of a heartbeat timeout apart: one
// ticker for all groups. The metadata group's failover matters to chain
// tables above all: their members are removed, and their reads confirmed,
// by its leader.
func (n *Node) expediteLoop() {
	silence, hb := n.expediteSilence(), n.heartbeatTimeout()
	if silence < 0 {
		return
	}
	t := time.NewTicker(max(hb/10, 5*time.Millisecond))
	defer t.Stop()
	var groups []*replication.Group
	handedOver := map[string]time.Time{} // by group: when its slow leader here last handed over
	last := time.Now()
	var lastGroupTick time.Time
	for {
		select {
		case <-n.closed:
			return
		case <-t.C:
		}
		// A tick this late means this process was stalled (a loaded
		// machine): peers' messages are still queued unread, and their
		// silence is this node's own.
		stalled := time.Since(last) > silence/2
		last = time.Now()
		// From half the silence on, not only once it is reached: each
		// call notes the replica's leader (ExpediteElection elects only
		// after the silence). A follower whose leader was cleared, by the
		// other follower's expedited election, before it noted the
		// leader, did not know it had just lost one, so when that
		// election failed (its candidate's log one entry behind) it left
		// the group to raft's timer: writes back after 650-730 ms in
		// local chaos runs instead of 250-400.
		silent := !stalled && n.mux.AnySilent(silence/2)
		// Timing (and slow leaders) every groupTickEvery; expedited
		// elections every tick.
		ticking := last.Sub(lastGroupTick) >= groupTickEvery
		if ticking {
			lastGroupTick = last
		}
		groups = groups[:0]
		if ticking || silent {
			n.mu.RLock()
			for _, g := range n.groups {
				groups = append(groups, g)
			}
			n.mu.RUnlock()
		}
		for _, g := range groups {
			if ticking {
				g.Tick(last)
			}
			// Only a silent peer node can be a silent leader's.
			if silent {
				if _, err := g.ExpediteElection(silence); err != nil {
					n.log.Warn("expedited election", "error", err)
				}
			}
			if ticking && g.SlowLeader() && time.Since(handedOver[g.ID()]) > leaderTransferEvery {
				handedOver[g.ID()] = time.Now()
				n.handOver(g)
			}
		}
		n.meta.Tick(last)
		if !silent {
			continue
		}
		if _, err := n.meta.ExpediteElection(silence); err != nil {
			n.log.Warn("expedited election", "error", err)
		}
	}
}

// groupTickEvery is how often the node ticks each group's timing
// (replication.Group.Tick). A tick looks for the log moving or the leader
// changing, to switch between the fast, quiet and dormant timings; finding
// it 100 ms late costs a little more time on the slow heartbeats, not a
// write's latency (appends do not wait for timing), while ticking 256
// mostly dormant groups every 20 ms was a fifth of an idle node's CPU.
// Expedited elections still look every tick.
const groupTickEvery = 100 * time.Millisecond

// handOver makes g's leader here, too slow to confirm its leadership in
// time (replication.Group.SlowLeader), hand leadership to another voter.
func (n *Node) handOver(g *replication.Group) {
	r := g.Raft()
	n.log.Warn("leading too slowly: the last leadership checks each took over half the heartbeat timeout; handing leadership over", "group", g.ID())
	n.spawn(func() {
		if err := replication.Await(r, g.TransferLeadership("", "")); err != nil {
			n.log.Info("handing over the leadership of a slow leader", "group", g.ID(), "error", err)
		}
	})
}

// Shard groups' Raft timing (NodeConfig.GroupHeartbeatTimeout).
const (
	// groupLeaderLease is a shard leader's lease: it steps down when no
	// majority answered it for this long. Idle, its followers answer an
	// append every commit timeout (50–100 ms) and a heartbeat every tenth
	// of the heartbeat timeout, so 300 ms leaves a margin of three for a
	// busy machine; a leader cut off steps down within twice it.
	groupLeaderLease = 300 * time.Millisecond
)

// DefaultQuiesceAfter is how long a shard group's log stands still before
// it switches to its quiet timing (NodeConfig.QuiesceAfter).
const DefaultQuiesceAfter = 2 * time.Second

// quietTiming is rc with quiescence (NodeConfig.QuiesceAfter), for every
// group, the metadata group's too: it writes only when the cluster's map
// changes, and on the fast timing it cost an idle cluster as much as all
// three nodes' own work.
func (n *Node) quietTiming(rc replication.RaftConfig) replication.RaftConfig {
	if q := n.cfg.QuiesceAfter; q >= 0 && n.cfg.ExpediteElection >= 0 && n.cfg.PingInterval >= 0 {
		rc.QuietAfter = q
		if q == 0 {
			rc.QuietAfter = DefaultQuiesceAfter
		}
		rc.QuietHeartbeatTimeout = n.cfg.QuietHeartbeatTimeout
	}
	return rc
}

// groupTiming is rc with the shard groups' timing: groupHeartbeatTimeout
// for the heartbeat and election timeouts and groupLeaderLease (at most
// the heartbeat timeout) for the lease.
func (n *Node) groupTiming(rc replication.RaftConfig) replication.RaftConfig {
	hb := n.groupHeartbeatTimeout()
	if hb <= 0 {
		return rc
	}
	rc.HeartbeatTimeout, rc.ElectionTimeout = hb, hb
	rc.LeaderLeaseTimeout = min(max(groupLeaderLease, rc.LeaderLeaseTimeout), hb)
	return n.dormancy(rc)
}

// DefaultDormantAfter is how much longer than QuiesceAfter a shard
// group's log stands still before the group goes dormant
// (NodeConfig.DormantAfter).
const DefaultDormantAfter = 10 * time.Second

// dormancy is rc with NodeConfig.DormantAfter, for a shard group on the
// quiet timing.
func (n *Node) dormancy(rc replication.RaftConfig) replication.RaftConfig {
	if rc.QuietAfter <= 0 || n.cfg.DormantAfter < 0 {
		return rc
	}
	rc.DormantAfter = n.cfg.DormantAfter
	if rc.DormantAfter == 0 {
		rc.DormantAfter = DefaultDormantAfter
	}
	return rc
}

// groupHeartbeatTimeout is NodeConfig.GroupHeartbeatTimeout with its
// default applied; 0 means the metadata group's. The default is one and a
// half expedite silences (300 ms at default flags), so that raft's own
// follower timer, which fires after a random [HT, 2HT], never fires
// before the expedited election it would race: when it did (HT equal to
// the silence, the timer's draw in its first few milliseconds), the
// follower ran a pre-vote that the other follower, still following the
// dead leader, refused, and as a candidate it could not expedite; if the
// other follower's expedited election then failed (its log an entry
// behind), the group waited for an election timeout more. Local chaos runs
// alternated (BENCHMARKS.md): partitions of a leader had writes back after
// p50 340-351 ms and max 580-600 ms at 200 ms, 265 ms and 361 ms at 300 ms.
// Without expedited elections raft's timer is all there is, and the
// metadata group's timing stays.
func (n *Node) groupHeartbeatTimeout() time.Duration {
	switch hb := n.cfg.GroupHeartbeatTimeout; {
	case hb > 0:
		return hb
	case hb < 0:
		return 0
	}
	s := n.expediteSilence()
	if s <= 0 {
		return 0
	}
	return max(s*3/2, n.heartbeatTimeout())
}

// raftConfig is the Raft config of one of this node's groups; peers, if
// set, bootstrap a group that has no state yet.
func (n *Node) raftConfig(group, dir string, tr raft.Transport, peers []raft.Server) replication.RaftConfig {
	rc := n.quietTiming(n.cfg.Raft)
	if group != api.MetaGroupID {
		rc = n.groupTiming(rc)
	}
	rc.ID, rc.NodeID, rc.Dir, rc.Transport = group, raft.ServerID(n.cfg.ID), dir, tr
	rc.Peers = peers
	rc.OnNoSpace = func() bool { return n.disk.Release("a Raft term or vote found the disk full") }
	rc.Metrics = n.groupMetrics(group)
	if rc.Logger == nil {
		rc.Logger = n.log.Named(group)
	}
	return rc
}

// MetaQuiet says whether this node's metadata replica runs the quiet
// timing now.
func (n *Node) MetaQuiet() bool { return n.meta.Quiet() }

// QuietReplicas counts this node's shard replicas, and those of them on
// their group's quiet timing (NodeConfig.QuiesceAfter).
func (n *Node) QuietReplicas() (quiet, total int) {
	return n.countReplicas((*replication.Group).Quiet)
}

// DormantReplicas counts this node's shard replicas, and those of them
// whose group is dormant (NodeConfig.DormantAfter).
func (n *Node) DormantReplicas() (dormant, total int) {
	return n.countReplicas((*replication.Group).Dormant)
}

// countReplicas counts this node's shard replicas, and those for which is
// holds.
func (n *Node) countReplicas(is func(*replication.Group) bool) (count, total int) {
	n.mu.RLock()
	defer n.mu.RUnlock()
	for _, g := range n.groups {
		total++
		if is(g) {
			count++
		}
	}
	return count, total
}
