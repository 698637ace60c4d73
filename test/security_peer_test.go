package test

import (
	"io"
	"log"
	"math"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-msgpack/v2/codec"
	"github.com/hashicorp/memberlist"
	"github.com/hashicorp/raft"
	"github.com/raftps/raftps/replication/chain/chainpb"
	"github.com/raftps/raftps/replication/transportpb"
	"github.com/raftps/raftps/shard/certs"
	"github.com/raftps/raftps/shard/shardpb"
	"google.golang.org/grpc/codes"
)

// The attacks on the peer listener and on gossip (security_test.go has
// the suite): forged Raft messages, chain streams, node-to-node calls, and
// a gossip member claiming to be n2.

// msgpackOf encodes a Raft message as the Raft transport carries it.
func msgpackOf(t *testing.T, v any) []byte {
	t.Helper()
	var b []byte
	if err := codec.NewEncoderBytes(&b, &codec.MsgpackHandle{}).Encode(v); err != nil {
		t.Fatal(err)
	}
	return b
}

// header is a Raft RPC header claiming to come from node id at addr.
func header(id, addr string) raft.RPCHeader {
	return raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte(id), Addr: []byte(addr)}
}

// raftForgeries: the forged heartbeat with term 2^64-1 for the
// metadata group (adopted, it wedged the group for good), and a forged
// AppendEntries injecting an entry (a poisonous one crashed every replica
// on replay), from a node of the CA that is not in the cluster and from a
// member claiming to be another.
func (b *attackBed) raftForgeries(t *testing.T) {
	n3, _ := b.node("n3")
	_, nd1 := b.node("n1")
	_, nd2 := b.node("n2")
	as9 := transportpb.NewRaftTransportClient(b.dial(nd1.PeerAddr, &b.n9))
	as3 := transportpb.NewRaftTransportClient(b.dial(nd1.PeerAddr, &n3))

	heartbeat := func(h raft.RPCHeader) *raft.AppendEntriesRequest {
		return &raft.AppendEntriesRequest{RPCHeader: h, Term: math.MaxUint64}
	}
	for _, tc := range []struct {
		what string
		c    transportpb.RaftTransportClient
		h    raft.RPCHeader
		msg  string
	}{
		{"a node outside the cluster", as9, header("n9", "127.0.0.1:1"), "node n9 is not a member of raft group meta"},
		{"n3 claiming to be n2", as3, header("n2", nd2.PeerAddr), "node n3 may not speak for node n2"},
		{"n3 at n2's address", as3, header("n3", nd2.PeerAddr), "node n3 is not a member of raft group meta at " + nd2.PeerAddr},
	} {
		resp, err := tc.c.Heartbeats(ctx10s(t), &transportpb.HeartbeatBatch{Rpcs: []*transportpb.RPC{{Group: "meta", Msgpack: msgpackOf(t, heartbeat(tc.h))}}})
		// A batch answers each heartbeat's refusal in its own error.
		if err != nil || len(resp.Rpcs) != 1 || !strings.Contains(resp.Rpcs[0].Error, tc.msg) {
			t.Errorf("a forged metadata heartbeat of term 2^64-1 from %s: %v %v, want a refusal saying %q", tc.what, resp, err, tc.msg)
		}
		_, err = tc.c.AppendEntries(ctx10s(t), &transportpb.RPC{Group: "meta", Msgpack: msgpackOf(t, heartbeat(tc.h))})
		refused(t, "a forged metadata AppendEntries from "+tc.what, err, codes.PermissionDenied, tc.msg)
		_, err = tc.c.RequestVote(ctx10s(t), &transportpb.RPC{Group: "meta", Msgpack: msgpackOf(t, &raft.RequestVoteRequest{RPCHeader: tc.h, Term: math.MaxUint64, LastLogIndex: math.MaxUint64, LastLogTerm: math.MaxUint64})})
		refused(t, "a forged vote request from "+tc.what, err, codes.PermissionDenied, tc.msg)
	}

	// An entry claiming 2^62 rows, into a shard group.
	poison := &raft.AppendEntriesRequest{RPCHeader: header("n9", "127.0.0.1:1"), Term: math.MaxUint64, LeaderCommitIndex: 1 << 40,
		Entries: []*raft.Log{{Index: 1 << 40, Term: math.MaxUint64, Type: raft.LogCommand, Data: []byte{1, 0, 0, 0, 0, 0, 0, 0, 0x40}}}}
	_, err := as9.AppendEntries(ctx10s(t), &transportpb.RPC{Group: "sec/0", Msgpack: msgpackOf(t, poison)})
	refused(t, "a forged AppendEntries into sec/0 from a node outside the cluster", err, codes.PermissionDenied, "node n9 is not a member of raft group sec/0")
	poison.RPCHeader = header("n2", nd2.PeerAddr)
	_, err = as3.AppendEntries(ctx10s(t), &transportpb.RPC{Group: "sec/0", Msgpack: msgpackOf(t, poison)})
	refused(t, "a forged AppendEntries into sec/0 from n3 claiming to be n2", err, codes.PermissionDenied, "node n3 may not speak for node n2")
	// The deprecated leader field, which Raft reads when the header has no
	// address, must agree with the header.
	//lint:ignore SA1019 the deprecated field is the attack
	poison.RPCHeader, poison.Leader = header("n3", ""), []byte(nd2.PeerAddr)
	_, err = as3.AppendEntries(ctx10s(t), &transportpb.RPC{Group: "sec/0", Msgpack: msgpackOf(t, poison)})
	refused(t, "an AppendEntries naming its leader in the deprecated field only", err, codes.InvalidArgument, "without its sender's ID and address")
}

// chainForgeries: a chain stream with a claimed sender, from outside the
// chain and from a member claiming another's address; a tail read from
// outside.
func (b *attackBed) chainForgeries(t *testing.T) {
	n3, _ := b.node("n3")
	_, nd1 := b.node("n1")
	_, nd2 := b.node("n2")
	for _, tc := range []struct {
		what string
		cc   chainpb.ChainClient
		msg  string
	}{
		{"a node outside the chain", chainpb.NewChainClient(b.dial(nd1.PeerAddr, &b.n9)), "node n9 is not a member of chain secchn/0"},
		{"n3 claiming n2's address", chainpb.NewChainClient(b.dial(nd1.PeerAddr, &n3)), "node n3 is not a member of chain secchn/0 as its member at " + nd2.PeerAddr},
	} {
		st, err := tc.cc.Replicate(ctx10s(t))
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Send(&chainpb.Forward{Group: "secchn/0", From: nd2.PeerAddr, Epoch: math.MaxUint64}); err != nil {
			t.Fatal(err)
		}
		ack, err := st.Recv()
		refused(t, "a chain stream from "+tc.what+" (ack "+ack.String()+")", err, codes.PermissionDenied, tc.msg)
	}
	_, err := chainpb.NewChainClient(b.dial(nd1.PeerAddr, &b.n9)).Read(ctx10s(t), &chainpb.ReadRequest{Group: "secchn/0", Keys: make([]byte, 8)})
	refused(t, "a chain read from a node outside the chain", err, codes.PermissionDenied, "node n9 is not a member of chain secchn/0")
}

// nodeCalls: Reconfigure ADD and REMOVE by others than the metadata
// leader, JoinCluster for another node, AssignHot with term 2^64-1 by
// others than the shard's leader, ReportBroken for another node, and the
// map-only calls from outside the map.
func (b *attackBed) nodeCalls(t *testing.T) {
	ctx := ctx10s(t)
	d, err := b.admin.Tables().Describe(ctx, "sec")
	if err != nil {
		t.Fatal(err)
	}
	leader := d.Shards[0].LeaderID
	var metaLeader string
	st, err := b.admin.Admin().NodeStatus(ctx, b.lc.Nodes[0].Addr, false)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range st.Replicas {
		if r.Group == "meta" {
			metaLeader = r.Leader
		}
	}
	if leader == "" || metaLeader == "" {
		t.Fatalf("shard sec/0 leader %q, metadata leader %q", leader, metaLeader)
	}
	var other string // a node that leads neither
	for _, nd := range b.lc.Nodes {
		if nd.ID != leader && nd.ID != metaLeader {
			other = nd.ID
		}
	}
	if other == "" {
		for _, nd := range b.lc.Nodes {
			if nd.ID != metaLeader {
				other = nd.ID
			}
		}
	}
	otherFiles, _ := b.node(other)
	_, leaderNode := b.node(leader)
	_, nd2 := b.node("n2")
	n3, _ := b.node("n3")
	as9 := shardpb.NewPeerClient(b.dial(leaderNode.PeerAddr, &b.n9))
	asOther := shardpb.NewPeerClient(b.dial(leaderNode.PeerAddr, &otherFiles))

	for _, op := range []shardpb.ReconfigureOp{shardpb.ReconfigureOp_RECONFIGURE_ADD, shardpb.ReconfigureOp_RECONFIGURE_REMOVE} {
		req := &shardpb.ReconfigureRequest{Table: "sec", Shard: 0, Op: op, NodeId: "n9", NodeAddr: "127.0.0.1:1"}
		if op == shardpb.ReconfigureOp_RECONFIGURE_REMOVE {
			req.NodeId, req.NodeAddr = other, ""
		}
		_, err := as9.Reconfigure(ctx10s(t), req)
		refused(t, "Reconfigure "+op.String()+" from a node outside the cluster", err, codes.PermissionDenied, "node n9 is not a member of the metadata group's voters")
		_, err = asOther.Reconfigure(ctx10s(t), req)
		refused(t, "Reconfigure "+op.String()+" from "+other+", not the metadata leader", err, codes.Unavailable, "is not the metadata leader")
	}

	_, err = shardpb.NewPeerClient(b.dial(nd2.PeerAddr, &n3)).JoinCluster(ctx10s(t), &shardpb.JoinClusterRequest{Node: &shardpb.ClusterNode{Id: "n9", Addr: "127.0.0.1:1", PeerAddr: "127.0.0.1:2"}})
	refused(t, "n3 joining the cluster as n9", err, codes.PermissionDenied, "node n3 may not speak for node n9")
	_, err = shardpb.NewPeerClient(b.dial(nd2.PeerAddr, &b.n9)).JoinCluster(ctx10s(t), &shardpb.JoinClusterRequest{Node: &shardpb.ClusterNode{Id: "n9", Addr: "10.9.9.9:7001", PeerAddr: "10.9.9.9:9001"}})
	refused(t, "n9 joining at a host its certificate does not name", err, codes.PermissionDenied, "whose certificate names host 10.9.9.9")

	hot := func(leaderAddr string) *shardpb.AssignHotRequest {
		return &shardpb.AssignHotRequest{Table: "sec", Shard: 0, Version: math.MaxUint64, Term: math.MaxUint64, Keys: make([]byte, 8), LeaderAddr: leaderAddr}
	}
	_, err = as9.AssignHot(ctx10s(t), hot("127.0.0.1:1"))
	refused(t, "AssignHot of term 2^64-1 from a node outside the cluster", err, codes.PermissionDenied, "node n9 is not a member of shard sec/0 as its leader")
	_, err = asOther.AssignHot(ctx10s(t), hot(leaderNode.PeerAddr))
	refused(t, "AssignHot from "+other+" naming the leader's address", err, codes.PermissionDenied, "node "+other+" is not a member of shard sec/0 as its leader")

	_, err = shardpb.NewPeerClient(b.dial(nd2.PeerAddr, &n3)).ReportBroken(ctx10s(t), &shardpb.ReportBrokenRequest{NodeId: "n2", Group: "secchn/0", Epoch: 1})
	refused(t, "n3 reporting n2's chain replica broken", err, codes.PermissionDenied, "node n3 may not speak for node n2")
	_, err = as9.Forward(ctx10s(t), &shardpb.ForwardRequest{From: "n9", Call: &shardpb.ForwardRequest_AlterTable{AlterTable: &shardpb.AlterTableRequest{Name: "sec", Consistency: shardpb.Consistency_CONSISTENCY_EVENTUAL}}})
	refused(t, "a forward from a node outside the map", err, codes.PermissionDenied, "node n9 is not a member of the cluster map")
	_, err = as9.ReadIndex(ctx10s(t), &shardpb.ReadIndexRequest{Table: "sec", Shard: 0})
	refused(t, "a read index from a node outside the shard", err, codes.PermissionDenied, "node n9 is not a member of shard sec/0")
	_, err = as9.Status(ctx10s(t), &shardpb.StatusRequest{})
	refused(t, "a node outside the map asking for status", err, codes.PermissionDenied, "node n9 is not a member of the cluster map")
	if _, err := asOther.Status(ctx10s(t), &shardpb.StatusRequest{}); err != nil {
		t.Errorf("a member asking for status: %v (the refusals above would prove nothing)", err)
	}
}

// gossip: a memberlist member claiming to be n2, without the cluster's
// gossip key and with another key, joins and leaves: nobody marks n2 dead
// (the suite's end checks every node sees every node alive and the chains
// unchanged).
func (b *attackBed) gossip(t *testing.T) {
	_, nd1 := b.node("n1")
	for _, key := range [][]byte{nil, make([]byte, certs.GossipKeyBytes)} {
		mc := memberlist.DefaultLocalConfig()
		mc.Name, mc.BindAddr, mc.BindPort, mc.AdvertisePort = "n2", "127.0.0.1", 0, 0
		mc.SecretKey = key
		mc.Logger, mc.LogOutput = log.New(io.Discard, "", 0), nil
		ml, err := memberlist.Create(mc)
		if err != nil {
			t.Fatal(err)
		}
		if n, err := ml.Join([]string{nd1.GossipAddr()}); err == nil || n != 0 {
			t.Errorf("a gossip member without the cluster's key (key %v) joined %d nodes: %v", key != nil, n, err)
		}
		_ = ml.Leave(time.Second)
		_ = ml.Shutdown()
	}
	// Plain UDP too: a forged packet is dropped, not parsed.
	if conn, err := net.Dial("udp", nd1.GossipAddr()); err == nil {
		_, _ = conn.Write([]byte{6, 'n', '2'}) // a dead-message type byte and junk
		conn.Close()
	}
	time.Sleep(2 * time.Second) // time for a forged "dead" to spread, had one been taken
}
