package shard

import (
	"testing"
	"time"

	"github.com/raftps/raftps/replication"
)

// TestGroupTimingDefaults: shard groups' raft timers start after one and a
// half expedite silences unless told otherwise, so raft's own follower
// timer never fires before the expedited election; the metadata group's
// timing is kept when asked (negative) or when elections are not
// expedited.
func TestGroupTimingDefaults(t *testing.T) {
	ms := time.Millisecond
	for _, c := range []struct {
		name                string
		hb, group, expedite time.Duration
		want                time.Duration // 0: the metadata group's
		wantLease           time.Duration
	}{
		{"defaults", 0, 0, 0, 300 * ms, 300 * ms},
		{"a longer metadata timeout", 400 * ms, 0, 0, 600 * ms, 300 * ms},
		{"a shorter expedite silence", 200 * ms, 0, 100 * ms, 200 * ms, 200 * ms},
		{"explicit", 0, time.Second, 0, time.Second, 300 * ms},
		{"negative: the metadata group's", 0, -1, 0, 0, 0},
		{"no expedited elections", 0, 0, -1, 0, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := NodeConfig{GroupHeartbeatTimeout: c.group, ExpediteElection: c.expedite}
			cfg.Raft.HeartbeatTimeout = c.hb
			n := &Node{cfg: cfg}
			base := replication.DefaultRaftConfig()
			if c.hb > 0 {
				base.HeartbeatTimeout, base.ElectionTimeout = c.hb, c.hb
			}
			rc := n.groupTiming(base)
			want, lease := c.want, c.wantLease
			if want == 0 {
				want, lease = base.HeartbeatTimeout, base.LeaderLeaseTimeout
			}
			if rc.HeartbeatTimeout != want || rc.ElectionTimeout != want || rc.LeaderLeaseTimeout != lease {
				t.Fatalf("heartbeat %s, election %s, lease %s; want %s, %s, %s",
					rc.HeartbeatTimeout, rc.ElectionTimeout, rc.LeaderLeaseTimeout, want, want, lease)
			}
		})
	}
}
