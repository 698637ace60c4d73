package shard

import (
	"errors"
	"fmt"
	"testing"

	"github.com/hashicorp/raft"
	"github.com/raftps/raftps/replication"
	"github.com/raftps/raftps/replication/chain"
	"github.com/raftps/raftps/shard/api"
	"github.com/raftps/raftps/shard/meta"
	"github.com/raftps/raftps/shard/shardpb"
	"google.golang.org/grpc/codes"
)

// TestErrorRoundTrip: every error a node answers with, wrapped with
// context and sent as a status, comes back on the other side as the wire
// error it stands for, with its code, and as no other of the table. The
// reason in the details decides, not the message: the message here names
// another error's text on purpose.
func TestErrorRoundTrip(t *testing.T) {
	n := &Node{cfg: NodeConfig{ID: "n1", Addr: "a1:1", PeerAddr: "p1:1"}, metaFSM: meta.New(func() {})}
	check := func(local, want error) {
		t.Helper()
		sent := fmt.Errorf("table %q: %w: detail mentioning %v", "t", local, api.ErrUnknownTable)
		got := fromStatus(n.toStatus(sent))
		if !errors.Is(got, want) {
			t.Errorf("%v: came back as %v, want %v", local, got, want)
		}
		_, code, _ := api.ReasonOf(want)
		var re *api.RemoteError
		if !errors.As(got, &re) || re.Code != code {
			t.Errorf("%v: came back with %v, want code %v", local, re, code)
		}
		for _, o := range api.Reasons() {
			if o.Err != want && errors.Is(got, o.Err) {
				t.Errorf("%v: came back as %v as well", local, o.Err)
			}
		}
	}
	for _, r := range api.Reasons() {
		check(r.Err, r.Err)
	}
	for _, e := range internalErrors {
		check(e.err, e.wire)
	}
	// An error of no table is Internal, with no reason.
	got := fromStatus(n.toStatus(errors.New("something else")))
	var re *api.RemoteError
	if !errors.As(got, &re) || re.Code != codes.Internal || re.Reason != "" || errors.Unwrap(got) != nil {
		t.Errorf("an unknown error came back as %#v", got)
	}
}

// TestNotLeaderNamesTheClientAddress: Raft names a leader by its peer
// address; a client must be told the client address, by the cluster map,
// or none if the map does not know the node.
func TestNotLeaderNamesTheClientAddress(t *testing.T) {
	m := meta.New(func() {})
	reg, err := meta.Encode(meta.CmdRegisterNode, &shardpb.ClusterNode{Id: "n2", Addr: "client-2:1", PeerAddr: "peer-2:1"})
	if err != nil {
		t.Fatal(err)
	}
	if err, ok := m.Apply(&raft.Log{Index: 1, Term: 1, Type: raft.LogCommand, Data: reg}).(error); ok {
		t.Fatal(err)
	}
	n := &Node{cfg: NodeConfig{ID: "n1", Addr: "client-1:1", PeerAddr: "peer-1:1"}, metaFSM: m}
	for _, tc := range []struct {
		name     string
		err      error
		id, addr string
	}{
		{"raft", &replication.NotLeaderError{Group: "t/0", LeaderID: "n2", LeaderAddr: "peer-2:1"}, "n2", "client-2:1"},
		{"raft, unknown ID", &replication.NotLeaderError{Group: "t/0", LeaderID: raft.ServerID("n9"), LeaderAddr: "peer-2:1"}, "n9", "client-2:1"},
		{"raft, unknown node", &replication.NotLeaderError{Group: "t/0", LeaderID: "n9", LeaderAddr: "peer-9:1"}, "n9", ""},
		{"chain head", &chain.NotHeadError{Group: "t/0", Head: "peer-2:1"}, "n2", "client-2:1"},
		{"chain head, this node", &chain.NotHeadError{Group: "t/0", Head: "peer-1:1"}, "n1", "client-1:1"},
	} {
		got := fromStatus(n.toStatus(fmt.Errorf("wrapped: %w", tc.err)))
		var re *api.RemoteError
		if !errors.As(got, &re) || !errors.Is(got, api.ErrNotLeader) || re.Group != "t/0" || re.LeaderID != tc.id || re.LeaderAddr != tc.addr {
			t.Errorf("%s: came back as %#v, want leader %s at %q", tc.name, re, tc.id, tc.addr)
		}
	}
}
