package shard

import (
	"context"
	"fmt"
	"time"

	"github.com/hashicorp/raft"
	"github.com/raftps/raftps/shard/api"
	"github.com/raftps/raftps/shard/shardpb"
)

// PeerContact answers when this node last heard from the node at the
// client address req.Addr: any message of any Raft group, or an answer to
// one, on the peer API (see shard/client, suspect.go, for how clients use
// it to tell a dead node from a slow one).
func (s *service) PeerContact(_ context.Context, req *shardpb.PeerContactRequest) (*shardpb.PeerContactResponse, error) {
	if req.Addr == "" {
		return nil, s.n.toStatus(fmt.Errorf("%w: peer contact: no address", api.ErrBadRequest))
	}
	peer := s.n.peerAddrAt(req.Addr)
	if peer == "" {
		return &shardpb.PeerContactResponse{}, nil
	}
	t, ok := s.n.mux.LastHeard(raft.ServerAddress(peer))
	if !ok {
		return &shardpb.PeerContactResponse{}, nil
	}
	return &shardpb.PeerContactResponse{Known: true, SilentNs: int64(time.Since(t))}, nil
}
