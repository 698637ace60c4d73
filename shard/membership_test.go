package shard

import (
	"encoding/json"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/memberlist"
)

func TestMembershipEvents(t *testing.T) {
	m := &membership{
		self:    nodeMeta{ID: "n1", Addr: "127.0.0.1:7001"},
		peers:   []Peer{{ID: "n1", PeerAddr: "127.0.0.1:9001"}, {ID: "n2", PeerAddr: "127.0.0.1:9002"}, {ID: "n3", PeerAddr: "127.0.0.1:9003"}},
		log:     hclog.NewNullLogger(),
		members: map[string]*MemberInfo{},
		lastAck: map[string]time.Time{},
	}
	node := func(id, addr string) *memberlist.Node {
		meta, _ := json.Marshal(nodeMeta{ID: id, Addr: addr})
		return &memberlist.Node{Name: id, Meta: meta}
	}
	states := func() map[string]MemberInfo {
		out := map[string]MemberInfo{}
		for _, mi := range m.Members() {
			out[mi.ID] = mi
		}
		return out
	}
	ev := eventDelegate{m}
	// Peers never heard from are dead, their client address unknown (the
	// peer list names peer addresses).
	if s := states(); len(s) != 3 || s["n2"].State != StateDead || s["n2"].Addr != "" {
		t.Fatalf("before any event: %v", s)
	}
	ev.NotifyJoin(node("n1", "127.0.0.1:7001"))
	ev.NotifyJoin(node("n2", "127.0.0.1:7002"))
	if s := states(); s["n1"].State != StateAlive || s["n2"].State != StateAlive || s["n3"].State != StateDead {
		t.Fatalf("after joins: %v", s)
	}
	ev.NotifyLeave(node("n2", "127.0.0.1:7002"))
	if s := states(); s["n2"].State != StateDead || s["n2"].Addr != "127.0.0.1:7002" {
		t.Fatalf("after leave: %v", s)
	}
	ev.NotifyUpdate(node("n2", "127.0.0.1:7012"))
	if s := states(); s["n2"].State != StateAlive || s["n2"].Addr != "127.0.0.1:7012" {
		t.Fatalf("after update: %v", s)
	}
	// A node that leaves this node's probes unanswered too long is suspect
	// (with 2 others alive: 2*2 probe intervals + the probe timeout).
	m.probe, m.probeTimeout = 100*time.Millisecond, 50*time.Millisecond
	m.lastAck["n2"] = time.Now().Add(-time.Second)
	m.lastAck["n3"] = time.Now()
	ev.NotifyJoin(node("n3", "127.0.0.1:7003"))
	if s := states(); s["n2"].State != StateSuspect || s["n3"].State != StateAlive || s["n1"].State != StateAlive {
		t.Fatalf("n2 silent for 1s: %v", s)
	}
	ev.NotifyLeave(node("n3", "127.0.0.1:7003"))
	m.probe = 0
	// A node outside the peer list (the elastic cluster to come) is listed.
	ev.NotifyJoin(node("n4", "127.0.0.1:7004"))
	if got := m.Members(); len(got) != 4 || got[3].ID != "n4" || got[3].State != StateAlive || got[2].State != StateDead {
		t.Fatalf("after n4 joins: %v", got)
	}
}

func TestDefaultGossipAddr(t *testing.T) {
	for in, want := range map[string]string{"127.0.0.1:7001": "127.0.0.1:8001", "[::1]:9000": "[::1]:10000", "host:1": "host:1001"} {
		if got, err := DefaultGossipAddr(in); err != nil || got != want {
			t.Errorf("DefaultGossipAddr(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"127.0.0.1:0", "127.0.0.1:65000", "nohost", "h:x"} {
		if got, err := DefaultGossipAddr(in); err == nil {
			t.Errorf("DefaultGossipAddr(%q) = %q, want an error", in, got)
		}
	}
}

// TestMembershipCrash: two nodes gossip on loopback; one stops without
// leaving (as if SIGKILLed) and the other sees it suspect, then dead.
func TestMembershipCrash(t *testing.T) {
	var addrs []string
	var ls []net.Listener
	for range 2 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
		addrs = append(addrs, l.Addr().String())
	}
	for _, l := range ls {
		l.Close()
	}
	peers := []Peer{{ID: "a", PeerAddr: "127.0.0.1:2001"}, {ID: "b", PeerAddr: "127.0.0.1:2002"}}
	var ms []*membership
	for i, p := range peers {
		cfg := MembershipConfig{Addr: addrs[i], Join: []string{addrs[1-i]},
			ProbeInterval: 100 * time.Millisecond, ProbeTimeout: 50 * time.Millisecond,
			GossipInterval: 20 * time.Millisecond, SuspicionMult: 10, RejoinInterval: 100 * time.Millisecond}
		m, err := newMembership(cfg, nodeMeta{ID: p.ID, Addr: fmt.Sprintf("127.0.0.1:%d", 7001+i)}, peers, hclog.NewNullLogger())
		if err != nil {
			t.Fatal(err)
		}
		ms = append(ms, m)
	}
	defer ms[0].close()
	stateOfB := func() string {
		for _, mi := range ms[0].Members() {
			if mi.ID == "b" {
				return mi.State
			}
		}
		return ""
	}
	waitState := func(want string, timeout time.Duration) {
		t.Helper()
		deadline := time.Now().Add(timeout)
		for stateOfB() != want {
			if time.Now().After(deadline) {
				t.Fatalf("b is %s after %s, want %s", stateOfB(), timeout, want)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	waitState(StateAlive, 5*time.Second)
	// A crash: no Leave.
	close(ms[1].stop)
	if err := ms[1].ml.Shutdown(); err != nil {
		t.Fatal(err)
	}
	ms[1].wg.Wait()
	waitState(StateSuspect, 5*time.Second)
	waitState(StateDead, 10*time.Second)
}
