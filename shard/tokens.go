package shard

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/raftps/raftps/shard/api"
	"github.com/raftps/raftps/shard/auth"
	"github.com/raftps/raftps/shard/certs"
	"github.com/raftps/raftps/shard/membership"
	"github.com/raftps/raftps/shard/meta"
	"github.com/raftps/raftps/shard/shardpb"
	"google.golang.org/protobuf/proto"
)

// Bearer tokens (docs/SECURITY.md, "Tokens"). The node that takes a
// CreateToken makes the token (auth.NewToken) and sends only its record to
// the metadata leader, so the secret crosses no link but the caller's.
// Every node's client gate checks tokens against its own metadata replica
// (tokenStore), with no call on the request path; the leader answers a
// creation or revocation once every live node of the map has applied it
// (awaitMetaApplied), so the caller's next call is judged alike on every
// node.

// DefaultMaxTokens bounds the bearer tokens a cluster holds, so that the
// metadata state stays small whatever an admin scripts.
const DefaultMaxTokens = 1024

// tokenSpreadWait bounds how long a token change waits for the nodes of
// the map to apply it; a node that has not by then is named in the
// answer's pending, and applies it when it catches up.
const tokenSpreadWait = 3 * time.Second

// tokenStore is the client gate's auth.TokenStore: this node's metadata
// replica. The gate is made before the replica, and serves calls only
// after it exists.
type tokenStore struct{ n *Node }

func (s tokenStore) Token(id string) (auth.TokenRecord, bool) {
	if s.n.metaFSM == nil {
		return auth.TokenRecord{}, false
	}
	return s.n.metaFSM.Token(id)
}

func (s *service) CreateToken(ctx context.Context, req *shardpb.CreateTokenRequest) (*shardpb.CreateTokenResponse, error) {
	role, err := certs.ParseRole(req.Role)
	if err != nil {
		return nil, s.n.toStatus(fmt.Errorf("%w: %w", api.ErrBadRequest, err))
	}
	tok, rec, err := auth.NewToken(req.Name, role)
	if err != nil {
		return nil, s.n.toStatus(fmt.Errorf("%w: %w", api.ErrBadRequest, err))
	}
	put := &shardpb.MetaPutToken{Token: meta.TokenRecordProto(rec)}
	resp, err := onMetaLeader(ctx, s.n, func() (*shardpb.CreateTokenResponse, error) { return s.n.putToken(ctx, put) },
		&shardpb.ForwardRequest{Call: &shardpb.ForwardRequest_PutToken{PutToken: put}}, (*shardpb.ForwardResponse).GetPutToken)
	if err != nil {
		return nil, err
	}
	out := proto.Clone(resp).(*shardpb.CreateTokenResponse)
	out.Token = tok
	return out, nil
}

func (s *service) ListTokens(ctx context.Context, req *shardpb.ListTokensRequest) (*shardpb.ListTokensResponse, error) {
	return onMetaLeader(ctx, s.n, s.n.listTokens,
		&shardpb.ForwardRequest{Call: &shardpb.ForwardRequest_ListTokens{ListTokens: req}}, (*shardpb.ForwardResponse).GetListTokens)
}

func (s *service) DeleteToken(ctx context.Context, req *shardpb.DeleteTokenRequest) (*shardpb.DeleteTokenResponse, error) {
	if req.Token == "" {
		return nil, s.n.toStatus(fmt.Errorf("%w: which token: give its ID or name", api.ErrBadRequest))
	}
	del := &shardpb.MetaDeleteToken{Token: req.Token}
	return onMetaLeader(ctx, s.n, func() (*shardpb.DeleteTokenResponse, error) { return s.n.deleteToken(ctx, del) },
		&shardpb.ForwardRequest{Call: &shardpb.ForwardRequest_DeleteToken{DeleteToken: del}}, (*shardpb.ForwardResponse).GetDeleteToken)
}

// putToken stores a token's record, as the metadata leader.
func (n *Node) putToken(ctx context.Context, put *shardpb.MetaPutToken) (*shardpb.CreateTokenResponse, error) {
	if err := meta.CheckTokenRecord(put.Token); err != nil {
		return nil, err
	}
	put = &shardpb.MetaPutToken{Token: put.Token, MaxTokens: DefaultMaxTokens}
	info, pending, err := n.applyTokenChange(ctx, meta.CmdPutToken, put, fmt.Sprintf("storing token %q", put.Token.Name))
	if err != nil {
		return nil, err
	}
	return &shardpb.CreateTokenResponse{Info: info, Pending: pending}, nil
}

// deleteToken revokes a token, as the metadata leader.
func (n *Node) deleteToken(ctx context.Context, del *shardpb.MetaDeleteToken) (*shardpb.DeleteTokenResponse, error) {
	info, pending, err := n.applyTokenChange(ctx, meta.CmdDeleteToken, del, fmt.Sprintf("revoking token %q", del.Token))
	if err != nil {
		return nil, err
	}
	return &shardpb.DeleteTokenResponse{Deleted: info, Pending: pending}, nil
}

// listTokens answers from the metadata leader's state after a barrier, so
// that a token just created or revoked through any node shows as such.
func (n *Node) listTokens() (*shardpb.ListTokensResponse, error) {
	if err := n.metaAuthoritative(); err != nil {
		return nil, fmt.Errorf("listing tokens: %w: node %s %v", api.ErrUnavailable, n.cfg.ID, err)
	}
	return &shardpb.ListTokensResponse{Tokens: n.metaFSM.Tokens()}, nil
}

// applyTokenChange commits a token command and waits for the nodes of the
// map to apply it: what the FSM answered, and the nodes that had not
// confirmed.
func (n *Node) applyTokenChange(ctx context.Context, cmd byte, arg proto.Message, what string) (*shardpb.TokenInfo, []string, error) {
	out, ix, err := n.applyMetaAt(cmd, arg, what)
	if err != nil {
		return nil, nil, err
	}
	info, ok := out.(*shardpb.TokenInfo)
	if !ok {
		return nil, nil, fmt.Errorf("%s: the metadata group answered %T", what, out)
	}
	return info, n.awaitMetaApplied(ctx, ix, tokenSpreadWait), nil
}

// awaitMetaApplied waits until every node of the cluster map has applied
// the metadata log up to ix (its Status's meta_processed), for at most
// wait: the IDs of the nodes that had not, sorted. A node gossip does not
// see alive is not waited for: it is pending at once.
func (n *Node) awaitMetaApplied(ctx context.Context, ix uint64, wait time.Duration) []string {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	members := n.memberMap()
	var (
		mu      sync.Mutex
		pending []string
		wg      sync.WaitGroup
	)
	for _, nd := range n.metaFSM.ClusterMap().Nodes {
		if nd.Id == n.cfg.ID {
			continue // the leader applied it before Apply returned
		}
		if st := members[nd.Id].State; st != membership.Alive && st != membership.Suspect {
			pending = append(pending, nd.Id)
			continue
		}
		wg.Add(1)
		go func(nd *shardpb.ClusterNode) {
			defer wg.Done()
			if !n.waitNodeApplied(ctx, nd.PeerAddr, ix) {
				mu.Lock()
				pending = append(pending, nd.Id)
				mu.Unlock()
			}
		}(nd)
	}
	wg.Wait()
	slices.Sort(pending)
	return pending
}

// waitNodeApplied asks the node at peerAddr for its status until it has
// applied the metadata log up to ix, or ctx ends.
func (n *Node) waitNodeApplied(ctx context.Context, peerAddr string, ix uint64) bool {
	for wait := time.Millisecond; ; wait = min(2*wait, 100*time.Millisecond) {
		st, err := n.statusOf(ctx, peerAddr)
		if err == nil && st.MetaProcessed >= ix {
			return true
		}
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return false
		}
	}
}
