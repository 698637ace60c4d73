package replication

import (
	"context"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// readsConfirmed runs n linearizable read indexes at group g's leader and
// returns what the nodes counted meanwhile: term checks sent and answered,
// and heartbeats sent.
func readsConfirmed(t *testing.T, c *expediteCluster, name string, n int) (sent, answered, heartbeats int64) {
	t.Helper()
	l, _ := c.leader(name, 10*time.Second)
	count := func() (s, a, h int64) {
		for _, nd := range c.nodes {
			st := nd.mux.Stats()
			s += st.TermChecksSent.Load()
			a += st.TermChecksAnswered.Load()
			h += st.HeartbeatsSent.Load()
		}
		return s, a, h
	}
	s0, a0, h0 := count()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := range n {
		if _, err := c.groups[name][l].ReadIndex(ctx); err != nil {
			t.Fatalf("read index %d at the leader: %v", i, err)
		}
	}
	s1, a1, h1 := count()
	return s1 - s0, a1 - a0, h1 - h0
}

// TestReadsCheckTermsNotHeartbeats: once the followers' answers say they
// take term checks, a leader's read indexes are confirmed by term checks
// (each read one per follower at most, answered without raft), not by
// heartbeats. A follower answers its own term, whatever term it is asked
// about; a follower that refuses the leader's messages refuses its
// term checks too.
func TestReadsCheckTermsNotHeartbeats(t *testing.T) {
	c := newExpediteCluster(t, "r/0")
	l, term := c.leader("r/0", 10*time.Second)
	// Raft's periodic heartbeats teach the leader's node that its peers
	// take term checks.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		learned := 0
		for i, nd := range c.nodes {
			if i != l && c.nodes[l].mux.heartbeatsTo(raft.ServerAddress(nd.addr)).takesConfirm.Load() {
				learned++
			}
		}
		if learned == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the leader's node learned that %d of 2 peers take term checks within 10s", learned)
		}
	}
	// Each read needs one follower's answer (the other's may still be on
	// its way when the read returns).
	sent, answered, _ := readsConfirmed(t, c, "r/0", 20)
	if answered < 20 || sent < answered || sent > 40 {
		t.Fatalf("20 reads: %d term checks sent, %d answered; want 20 to 40 sent, at least 20 answered", sent, answered)
	}

	leader := c.groups["r/0"][l]
	tr := leader.cfg.Transport.(*Transport)
	addr := tr.EncodePeer(leader.cfg.NodeID, raft.ServerAddress(c.nodes[l].addr))
	f := (l + 1) % 3
	target := raft.ServerAddress(c.nodes[f].addr)
	asked := term + 1000
	got, ok, err := tr.checkTerm(target, leader.cfg.NodeID, addr, asked)
	if err != nil || !ok {
		t.Fatalf("term check of term %d at a follower: %d, ok %v, %v", asked, got, ok, err)
	}
	if want := c.groups["r/0"][f].raft.CurrentTerm(); got != want {
		t.Fatalf("follower answered term %d for a check of term %d; its term is %d", got, asked, want)
	}

	c.mu.Lock()
	c.deaf[f] = string(leader.cfg.NodeID)
	c.mu.Unlock()
	if got, ok, err := tr.checkTerm(target, leader.cfg.NodeID, addr, term); err == nil {
		t.Fatalf("a follower deaf to the leader answered its term check: %d, ok %v", got, ok)
	}
}

// TestReadsConfirmedByOlderBuilds: followers of a build that answers no
// term checks (NoConfirms) get heartbeats for the leadership checks, and
// reads are confirmed as before; so are a leader's of such a build. A leader
// that still believes its followers take term checks after they went back
// to an older build confirms its reads too.
func TestReadsConfirmedByOlderBuilds(t *testing.T) {
	for _, old := range []string{"followers", "all"} {
		t.Run(old, func(t *testing.T) {
			c := newExpediteClusterMux(t, func(i int, cfg *MuxConfig) {
				cfg.NoConfirms = old == "all" || i != 0
			}, nil, "r/0")
			g := c.groups["r/0"]
			l, _ := c.leader("r/0", 10*time.Second)
			if l != 0 {
				// Leadership to node 0, the new build, if it is one.
				if err := g[l].raft.LeadershipTransferToServer(raft.ServerID(c.nodes[0].addr), raft.ServerAddress(c.nodes[0].addr)).Error(); err != nil {
					t.Fatalf("leadership transfer to node 0: %v", err)
				}
				c.leader("r/0", 10*time.Second)
			}
			time.Sleep(300 * time.Millisecond)
			sent, answered, heartbeats := readsConfirmed(t, c, "r/0", 20)
			if sent != 0 || answered != 0 {
				t.Fatalf("%d term checks sent and %d answered with older builds", sent, answered)
			}
			if heartbeats < 20 {
				t.Fatalf("20 reads confirmed with %d heartbeats", heartbeats)
			}
			if old != "followers" {
				return
			}
			// A rollback: node 0 believes its peers take term checks
			// (they did, before going back to an older build). Each read
			// sends them one, which they refuse, and the refusal's answer
			// takes takes_confirm back, so the read sends heartbeats and
			// is confirmed all the same.
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			before := c.nodes[0].mux.Stats().TermChecksSent.Load()
			for i := range 10 {
				for _, nd := range c.nodes[1:] {
					c.nodes[0].mux.heartbeatsTo(raft.ServerAddress(nd.addr)).takesConfirm.Store(true)
				}
				if _, err := g[0].ReadIndex(ctx); err != nil {
					t.Fatalf("read %d after the peers went back to an older build: %v", i, err)
				}
			}
			if c.nodes[0].mux.Stats().TermChecksSent.Load() == before {
				t.Fatal("no term check went to the rolled-back peers: the test did not test the rollback")
			}
		})
	}
}
