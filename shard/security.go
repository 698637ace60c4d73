package shard

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	"github.com/raftps/raftps/shard/api"
	"github.com/raftps/raftps/shard/auth"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
)

// How a node authenticates its callers and itself (docs/SECURITY.md): the
// gates of its two listeners, the credentials it dials its peers with, and
// the checks of what a peer may say (Raft and chain messages here, the
// peer API's calls in peerauth.go). With NodeConfig.Insecure the gates let
// everyone through as "anyone", and every check below passes: one code
// path either way.

// clientConnAge bounds how long one client connection lives: a connection
// outlives the certificate it was opened with, so this bounds how long an
// expired or no longer trusted client keeps its access. Not on the peer
// listener, where it would cut Raft's long streams (peers are renewed by
// rotation anyway).
const (
	clientConnAge      = time.Hour
	clientConnAgeGrace = time.Minute
)

// insecureWarnEvery is how often a node run with --insecure says so again.
const insecureWarnEvery = time.Minute

// listenerOptions are the gates' options of the client and peer gRPC
// servers, to be put before every other option: nothing else runs for a
// call a gate refuses.
func (n *Node) listenerOptions() (client, peer []grpc.ServerOption, err error) {
	var cg, pg *auth.Gate
	if n.cfg.Insecure {
		cg, err = auth.NewClientGate(auth.Config{Insecure: true})
		if err == nil {
			pg, err = auth.NewPeerGate(auth.Config{Insecure: true})
		}
	} else {
		refused := n.refusalLogger()
		cg, err = auth.NewClientGate(auth.Config{Source: n.cfg.Certs, Tokens: tokenStore{n}, OnRefused: refused})
		if err == nil {
			pg, err = auth.NewPeerGate(auth.Config{Source: n.cfg.Certs, OnRefused: refused})
		}
	}
	if err != nil {
		return nil, nil, err
	}
	client = append(cg.ServerOptions(), grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionAge: clientConnAge, MaxConnectionAgeGrace: clientConnAgeGrace}))
	peer = append(pg.ServerOptions(), grpc.ChainUnaryInterceptor(n.checkPeerCall))
	return client, peer, nil
}

// refusalLogger logs refused calls, at most one a second (a scan of the
// port must not flood the log), saying how many it did not log.
func (n *Node) refusalLogger() func(method string, err error) {
	var last atomic.Int64
	var skipped atomic.Int64
	return func(method string, err error) {
		now := time.Now().UnixNano()
		if prev := last.Load(); now-prev < int64(time.Second) || !last.CompareAndSwap(prev, now) {
			skipped.Add(1)
			return
		}
		n.log.Warn("refused a call", "method", method, "error", err, "refusals-not-logged", skipped.Swap(0))
	}
}

// peerDialCreds are the transport credentials of this node's connections
// to its peers: its node certificate, and the node answering must be the
// one the cluster map (or the static peer list) puts at the address.
func (n *Node) peerDialCreds() grpc.DialOption {
	if n.cfg.Insecure {
		return grpc.WithTransportCredentials(insecure.NewCredentials())
	}
	return grpc.WithTransportCredentials(auth.NodeCredentials(n.cfg.Certs, n.nodeIDAt))
}

// nodeIDAt is the ID of the node at peer address addr by the cluster map
// or the static peer list, "" if neither knows it (a --join address).
func (n *Node) nodeIDAt(addr string) string {
	for _, p := range n.cfg.Peers {
		if p.PeerAddr == addr {
			return p.ID
		}
	}
	if n.metaFSM == nil {
		return ""
	}
	id, _ := n.nodeAt(addr)
	return id
}

// peerAddrOf is node id's peer address by the cluster map or the static
// peer list, "" if neither knows it.
func (n *Node) peerAddrOf(id string) string {
	if id == n.cfg.ID {
		return n.cfg.PeerAddr
	}
	if nd := n.metaFSM.Node(id); nd != nil {
		return nd.PeerAddr
	}
	for _, p := range n.cfg.Peers {
		if p.ID == id {
			return p.PeerAddr
		}
	}
	return ""
}

// gossipAddrOf is node id's gossip address by the cluster map ("" if
// none): membership refuses a member of that name gossiping from
// elsewhere.
func (n *Node) gossipAddrOf(id string) string {
	if n.metaFSM == nil {
		return ""
	}
	if nd := n.metaFSM.Node(id); nd != nil {
		return nd.GossipAddr
	}
	return ""
}

// warnInsecure repeats, every insecureWarnEvery, that this node
// authenticates nobody.
func (n *Node) warnInsecure() {
	t := time.NewTicker(insecureWarnEvery)
	defer t.Stop()
	for {
		n.log.Warn("INSECURE: this node serves plaintext and authenticates nobody: anyone who reaches its ports can read, write and administer the cluster (started with --insecure)")
		select {
		case <-n.closed:
			return
		case <-t.C:
		}
	}
}

// authorizeRaft is the Raft transport's check (replication.MuxConfig's
// Authorize): the message's sender is the caller's certificate's node, at
// the peer address the map has for it, and a member of the group.
func (n *Node) authorizeRaft(ctx context.Context, group, id, addr string) error {
	if err := auth.RequireNode(ctx, id); err != nil {
		return err
	}
	_, err := auth.RequireMember(ctx, "raft group "+group+" at "+addr, func(caller string) bool {
		if want := n.peerAddrOf(caller); want != "" && want != addr {
			return false
		}
		return n.inRaftGroup(group, caller, addr)
	})
	return err
}

// inRaftGroup reports whether node id (at peer address addr) is a member
// of the Raft group: in its latest configuration here, committed or not,
// or placed on the shard by the map, moves included. A follower whose
// configuration is stale must still accept a leader the map already
// placed, or it could never catch up. A group with no configuration here
// yet (a node that has not been added to the metadata group) takes any
// node: it has nothing to lose, and the first leader brings the
// configuration.
func (n *Node) inRaftGroup(group, id, addr string) bool {
	var r *raft.Raft
	if group == api.MetaGroupID {
		r = n.meta.Raft
		if n.metaFSM.Node(id) != nil {
			return true
		}
	} else {
		if sm := n.metaFSM.ShardMapByID(group); sm != nil && (slices.Contains(sm.Replicas, id) || sm.Adding == id) {
			return true
		}
		n.mu.RLock()
		g := n.groups[group]
		n.mu.RUnlock()
		if g == nil {
			return false
		}
		r = g.Raft()
	}
	servers := r.GetConfiguration().Configuration().Servers
	if len(servers) == 0 {
		return true
	}
	for _, s := range servers {
		if string(s.ID) == id {
			return string(s.Address) == addr
		}
	}
	return false
}

// authorizeChain is the chain transport's check (chain.MuxConfig's
// Authorize): the caller is in the chain, and a replication stream's
// claimed sender (a peer address) is the caller's.
func (n *Node) authorizeChain(ctx context.Context, group, from string) error {
	what := "chain " + group
	if from != "" {
		what = fmt.Sprintf("chain %s as its member at %s", group, from)
	}
	_, err := auth.RequireMember(ctx, what, func(caller string) bool {
		if from != "" && n.peerAddrOf(caller) != from {
			return false
		}
		return n.inChain(group, caller)
	})
	return err
}

// inChain reports whether the map places node id on the chain shard.
func (n *Node) inChain(group, id string) bool {
	sm := n.metaFSM.ShardMapByID(group)
	return sm != nil && (slices.Contains(sm.Replicas, id) || sm.Adding == id)
}
