package membership

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
	m := &Membership{
		self:    nodeMeta{ID: "n1", Addr: "127.0.0.1:7001"},
		expect:  []string{"n1", "n2", "n3"},
		log:     hclog.NewNullLogger(),
		members: map[string]*Member{},
		lastAck: map[string]time.Time{},
	}
	node := func(id, addr string) *memberlist.Node {
		meta, _ := json.Marshal(nodeMeta{ID: id, Addr: addr})
		return &memberlist.Node{Name: id, Meta: meta}
	}
	states := func() map[string]Member {
		out := map[string]Member{}
		for _, mi := range m.Members() {
			out[mi.ID] = mi
		}
		return out
	}
	ev := eventDelegate{m}
	// Expected nodes never heard from are dead, their client address
	// unknown (a node's peer list names peer addresses).
	if s := states(); len(s) != 3 || s["n2"].State != Dead || s["n2"].Addr != "" {
		t.Fatalf("before any event: %v", s)
	}
	ev.NotifyJoin(node("n1", "127.0.0.1:7001"))
	ev.NotifyJoin(node("n2", "127.0.0.1:7002"))
	if s := states(); s["n1"].State != Alive || s["n2"].State != Alive || s["n3"].State != Dead {
		t.Fatalf("after joins: %v", s)
	}
	ev.NotifyLeave(node("n2", "127.0.0.1:7002"))
	if s := states(); s["n2"].State != Dead || s["n2"].Addr != "127.0.0.1:7002" {
		t.Fatalf("after leave: %v", s)
	}
	ev.NotifyUpdate(node("n2", "127.0.0.1:7012"))
	if s := states(); s["n2"].State != Alive || s["n2"].Addr != "127.0.0.1:7012" {
		t.Fatalf("after update: %v", s)
	}
	// A node that leaves this node's probes unanswered too long is suspect
	// (with 2 others alive: 2*2 probe intervals + the probe timeout).
	m.probe, m.probeTimeout = 100*time.Millisecond, 50*time.Millisecond
	m.lastAck["n2"] = time.Now().Add(-time.Second)
	m.lastAck["n3"] = time.Now()
	ev.NotifyJoin(node("n3", "127.0.0.1:7003"))
	if s := states(); s["n2"].State != Suspect || s["n3"].State != Alive || s["n1"].State != Alive {
		t.Fatalf("n2 silent for 1s: %v", s)
	}
	ev.NotifyLeave(node("n3", "127.0.0.1:7003"))
	m.probe = 0
	// A node outside the peer list (the elastic cluster to come) is listed.
	ev.NotifyJoin(node("n4", "127.0.0.1:7004"))
	if got := m.Members(); len(got) != 4 || got[3].ID != "n4" || got[3].State != Alive || got[2].State != Dead {
		t.Fatalf("after n4 joins: %v", got)
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
	ids := []string{"a", "b"}
	var ms []*Membership
	for i, id := range ids {
		cfg := Config{Addr: addrs[i], Join: []string{addrs[1-i]},
			ProbeInterval: 100 * time.Millisecond, ProbeTimeout: 50 * time.Millisecond,
			GossipInterval: 20 * time.Millisecond, SuspicionMult: 10, RejoinInterval: 100 * time.Millisecond}
		m, err := New(cfg, Local{ID: id, Addr: fmt.Sprintf("127.0.0.1:%d", 7001+i), Expect: ids})
		if err != nil {
			t.Fatal(err)
		}
		ms = append(ms, m)
	}
	defer ms[0].Close()
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
	waitState(Alive, 5*time.Second)
	// A crash: no Leave.
	close(ms[1].stop)
	if err := ms[1].ml.Shutdown(); err != nil {
		t.Fatal(err)
	}
	ms[1].wg.Wait()
	waitState(Suspect, 5*time.Second)
	waitState(Dead, 10*time.Second)
}
