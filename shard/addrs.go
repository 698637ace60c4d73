package shard

import (
	"fmt"
	"net"
	"slices"
	"strconv"

	"github.com/raftps/raftps/shard/membership"
	"github.com/raftps/raftps/shard/shardpb"
)

// A node has three addresses: the client API's (Addr), the peer API's
// (PeerAddr: Raft, chains, node-to-node calls) and the gossip's
// (memberlist, UDP and TCP). By default the last two are derived from the
// first, so that one address per node is all a cluster's configuration
// names: a node at host:P serves peers on host:P+PeerPortOffset and gossips
// on host:P+GossipPortOffset.
const (
	GossipPortOffset = 1000
	PeerPortOffset   = 2000
)

// offsetAddr is addr's host with its port moved by offset.
func offsetAddr(addr string, offset int, what string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", err
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return "", fmt.Errorf("address %q: port %q is not a number", addr, port)
	}
	if p == 0 || p+offset <= 0 || p+offset > 65535 {
		return "", fmt.Errorf("address %q: no default %s port for port %d (give the %s address explicitly)", addr, what, p, what)
	}
	return net.JoinHostPort(host, strconv.Itoa(p+offset)), nil
}

// DefaultPeerAddr is the default peer address of a node whose client
// address is addr: the same host, port + PeerPortOffset.
func DefaultPeerAddr(addr string) (string, error) { return offsetAddr(addr, PeerPortOffset, "peer") }

// DefaultGossipAddr is the default gossip address of a node whose client
// address is addr: the same host, port + GossipPortOffset.
func DefaultGossipAddr(addr string) (string, error) {
	return offsetAddr(addr, GossipPortOffset, "gossip")
}

// GossipAddrOfPeer is the gossip address of the node at peer address peer,
// if that node runs with the default layout: how a node that knows another
// by its peer address alone (Peers, Join) finds its gossip before the
// cluster map says.
func GossipAddrOfPeer(peer string) (string, error) {
	return offsetAddr(peer, GossipPortOffset-PeerPortOffset, "gossip")
}

// gossipConfig is the Gossip config with the node's defaults filled in (see
// NodeConfig.Gossip): the gossip address from the client address, and whom
// to join from the join addresses or else the other static peers, all in
// the default address layout.
func (c NodeConfig) gossipConfig() (membership.Config, error) {
	gossip := c.Gossip
	gossip.Join = slices.Clone(gossip.Join)
	if gossip.Addr == "" {
		var err error
		if gossip.Addr, err = DefaultGossipAddr(c.Addr); err != nil {
			return gossip, fmt.Errorf("gossip address: %w", err)
		}
	}
	if len(gossip.Join) == 0 {
		for _, a := range c.Join {
			if ga, err := GossipAddrOfPeer(a); err == nil {
				gossip.Join = append(gossip.Join, ga)
			}
		}
	}
	if len(gossip.Join) == 0 {
		for _, p := range c.Peers {
			if p.ID == c.ID {
				continue
			}
			a, err := GossipAddrOfPeer(p.PeerAddr)
			if err != nil {
				return gossip, fmt.Errorf("gossip address of peer %s: %w", p.ID, err)
			}
			gossip.Join = append(gossip.Join, a)
		}
	}
	return gossip, nil
}

// clientAddrOf is the client address of node id by this node's cluster
// map, or else of the node at peer address peer; "" if neither is known.
// Raft knows nodes by their peer address; clients must be told the other.
func (n *Node) clientAddrOf(id, peer string) string {
	if nd := n.metaFSM.Node(id); nd != nil {
		return nd.Addr
	}
	_, addr := n.nodeAt(peer)
	return addr
}

// nodeAt is the ID and client address of the node at peer address peer by
// this node's cluster map ("" if none).
func (n *Node) nodeAt(peer string) (id, addr string) {
	if peer == "" {
		return "", ""
	}
	if peer == n.cfg.PeerAddr {
		return n.cfg.ID, n.cfg.Addr
	}
	if nd := n.metaFSM.FindNode(func(nd *shardpb.ClusterNode) bool { return nd.PeerAddr == peer }); nd != nil {
		return nd.Id, nd.Addr
	}
	return "", ""
}

// peerAddrAt is the peer address of the node at client address addr by this
// node's cluster map ("" if none).
func (n *Node) peerAddrAt(addr string) string {
	if addr == n.cfg.Addr {
		return n.cfg.PeerAddr
	}
	if nd := n.metaFSM.FindNode(func(nd *shardpb.ClusterNode) bool { return nd.Addr == addr }); nd != nil {
		return nd.PeerAddr
	}
	return ""
}
