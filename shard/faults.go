package shard

import (
	"fmt"
	"time"

	"github.com/raftps/raftps/shard/api"
)

// BlockPeers makes this node treat the peers at addrs (gRPC or gossip
// addresses) as unreachable, replacing the set it had; none unblocks every
// peer. In-process tests partition a cluster with it as raftps chaos does
// through /debug/netfault (package netfault). It needs
// NodeConfig.FaultInjection.
func (n *Node) BlockPeers(addrs ...string) error {
	if n.fault == nil {
		return fmt.Errorf("node %s: %w: started without fault injection", n.cfg.ID, api.ErrBadRequest)
	}
	n.fault.Block(addrs)
	return nil
}

// SetDelay makes this node slow: every unary call it answers (client and
// peer APIs) and every unary call it makes to a peer is d late; 0 ends it.
// It needs NodeConfig.FaultInjection.
func (n *Node) SetDelay(d time.Duration) error {
	if n.fault == nil {
		return fmt.Errorf("node %s: %w: started without fault injection", n.cfg.ID, api.ErrBadRequest)
	}
	n.fault.SetDelay(d)
	return nil
}
