package membership

import (
	"bytes"
	"fmt"
	"net"
	"testing"
	"time"
)

// TestGossipKeys: a member with the cluster's key is seen alive; one with
// another key, or none, is not, nor one with the key that gossips under a
// name the map places elsewhere.
func TestGossipKeys(t *testing.T) {
	var addrs []string
	var ls []net.Listener
	for range 5 {
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
	key, other := bytes.Repeat([]byte{1}, 32), bytes.Repeat([]byte{2}, 32)
	// The map puts a and b at their addresses, and c at a's: the member
	// gossiping as c from elsewhere is an impostor.
	where := map[string]string{"a": addrs[0], "b": addrs[1], "c": addrs[0]}
	start := func(i int, id string, keys [][]byte) *Membership {
		t.Helper()
		cfg := Config{Addr: addrs[i], Join: []string{addrs[0]}, Keys: keys,
			ProbeInterval: 100 * time.Millisecond, ProbeTimeout: 50 * time.Millisecond,
			GossipInterval: 20 * time.Millisecond, RejoinInterval: 100 * time.Millisecond}
		if i == 0 {
			cfg.Join = nil
		}
		m, err := New(cfg, Local{ID: id, Addr: fmt.Sprintf("127.0.0.1:%d", 7001+i), GossipAddrOf: func(id string) string { return where[id] }})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		return m
	}
	a := start(0, "a", [][]byte{key})
	start(1, "b", [][]byte{key})
	start(2, "c", [][]byte{key})
	start(3, "d", [][]byte{other})
	start(4, "e", nil)
	alive := func() map[string]bool {
		out := map[string]bool{}
		for _, m := range a.Members() {
			out[m.ID] = m.State == Alive
		}
		return out
	}
	deadline := time.Now().Add(5 * time.Second)
	for !alive()["b"] {
		if time.Now().After(deadline) {
			t.Fatalf("a does not see b, which has the key, alive: %v", a.Members())
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(time.Second) // the others had as long, and more
	if got := alive(); got["c"] || got["d"] || got["e"] {
		t.Errorf("a sees %v alive: c (an impostor), d (another key) and e (no key) must not be", got)
	}
}
