package shard

import (
	"reflect"
	"slices"
	"testing"

	"github.com/raftps/raftps/shard/membership"
)

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

// TestGossipConfigDefaults: the node, not membership, derives the gossip
// address from the client address and whom to join from its join addresses
// or else its other static peers; what the config gives is kept.
func TestGossipConfigDefaults(t *testing.T) {
	peers := []Peer{{ID: "a", PeerAddr: "127.0.0.1:9001"}, {ID: "b", PeerAddr: "127.0.0.1:9002"}, {ID: "c", PeerAddr: "127.0.0.1:9003"}}
	for _, tc := range []struct {
		name     string
		cfg      NodeConfig
		want     membership.Config
		wantFail bool
	}{
		{"peers", NodeConfig{ID: "a", Addr: "127.0.0.1:7001", Peers: peers},
			membership.Config{Addr: "127.0.0.1:8001", Join: []string{"127.0.0.1:8002", "127.0.0.1:8003"}}, false},
		{"join", NodeConfig{ID: "d", Addr: "127.0.0.1:7004", Join: []string{"127.0.0.1:9001", "nonsense"}},
			membership.Config{Addr: "127.0.0.1:8004", Join: []string{"127.0.0.1:8001"}}, false},
		{"given", NodeConfig{ID: "a", Addr: "127.0.0.1:7001", Peers: peers, Gossip: membership.Config{Addr: "127.0.0.1:5000", Join: []string{"127.0.0.1:5001"}}},
			membership.Config{Addr: "127.0.0.1:5000", Join: []string{"127.0.0.1:5001"}}, false},
		{"bootstrap", NodeConfig{ID: "a", Addr: "127.0.0.1:7001", Bootstrap: true},
			membership.Config{Addr: "127.0.0.1:8001"}, false},
		{"bad peer", NodeConfig{ID: "a", Addr: "127.0.0.1:7001", Peers: []Peer{{ID: "a", PeerAddr: "127.0.0.1:9001"}, {ID: "b", PeerAddr: "nonsense"}}},
			membership.Config{}, true},
		{"no default port", NodeConfig{ID: "a", Addr: "127.0.0.1:0", Bootstrap: true}, membership.Config{}, true},
	} {
		got, err := tc.cfg.gossipConfig()
		if tc.wantFail {
			if err == nil {
				t.Errorf("%s: %+v, want an error", tc.name, got)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: %+v, %v; want %+v", tc.name, got, err, tc.want)
		}
	}
}

func TestParsePeers(t *testing.T) {
	got, err := ParsePeers(" n1=127.0.0.1:9001,,n2=127.0.0.1:9002 ")
	want := []Peer{{"n1", "127.0.0.1:9001"}, {"n2", "127.0.0.1:9002"}}
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("ParsePeers = %v, %v; want %v", got, err, want)
	}
	for _, bad := range []string{"n1", "n1=", "=127.0.0.1:9001", "n1=a,n2"} {
		if _, err := ParsePeers(bad); err == nil {
			t.Errorf("ParsePeers(%q): no error", bad)
		}
	}
}
