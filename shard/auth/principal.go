package auth

import (
	"context"
	"fmt"

	"github.com/raftps/raftps/shard/certs"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
)

// Principal is a caller as a gate authenticated it: a node or a client by
// its certificate, a client by its token, or, on a listener that
// authenticates nobody (a node run with --insecure), anyone.
type Principal struct {
	// Identity is the node's ID, or the client's name and role (for a token,
	// the name and role its record holds).
	certs.Identity
	// TokenID is the token's ID when the client authenticated by token.
	TokenID string
	// Insecure: the listener authenticates nobody; every check passes.
	Insecure bool
}

func (p Principal) String() string {
	switch {
	case p.Insecure:
		return "anyone (insecure)"
	case p.TokenID != "":
		return fmt.Sprintf("token %s of %s (%v)", p.TokenID, p.Name, p.Role)
	}
	return p.Identity.String()
}

type principalKey struct{}

// WithPrincipal returns ctx carrying p: what the gates do for the
// handlers after them.
func WithPrincipal(ctx context.Context, p Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// FromContext returns the caller a gate put on ctx.
func FromContext(ctx context.Context) (Principal, bool) {
	p, ok := ctx.Value(principalKey{}).(Principal)
	return p, ok
}

// NodeID returns the ID of the node that made the call, as its
// certificate proves it; false if the caller is not an authenticated node
// (or the listener authenticates nobody).
func NodeID(ctx context.Context) (string, bool) {
	p, ok := FromContext(ctx)
	if !ok || p.Insecure || p.Kind != certs.KindNode {
		return "", false
	}
	return p.Name, true
}

// RequireNode returns nil if the caller is node id: for a message that
// claims to come from id (a Raft leader's ID or address, a chain's sender,
// a node reporting about itself). Else a PermissionDenied error naming
// both. It passes on an insecure listener, and fails closed on a context
// no gate has seen.
func RequireNode(ctx context.Context, id string) error {
	p, err := node(ctx)
	if err != nil || p.Insecure {
		return err
	}
	if p.Name != id {
		return denied(fmt.Sprintf("node %s may not speak for node %s", p.Name, brief(id, 64)))
	}
	return nil
}

// RequireMember returns the caller's node ID if isMember says it belongs
// to what (a Raft group, a chain, the cluster map), for messages that only
// members may send; else a PermissionDenied error naming both. isMember is
// given the caller's node ID; the membership data lives with the caller of
// RequireMember. On an insecure listener it returns "" and nil.
func RequireMember(ctx context.Context, what string, isMember func(nodeID string) bool) (string, error) {
	p, err := node(ctx)
	if err != nil || p.Insecure {
		return "", err
	}
	if !isMember(p.Name) {
		return "", denied(fmt.Sprintf("node %s is not a member of %s", p.Name, brief(what, 256)))
	}
	return p.Name, nil
}

// brief is a claimed name as a refusal quotes it: a message must not echo
// a megabyte a caller sent.
func brief(s string, n int) string {
	if len(s) > n {
		return fmt.Sprintf("%q... (%d bytes)", s[:n], len(s))
	}
	return s
}

func node(ctx context.Context) (Principal, error) {
	p, ok := FromContext(ctx)
	switch {
	case !ok:
		return p, unauthenticated("no authenticated caller: the call did not pass the peer gate")
	case p.Insecure:
		return p, nil
	case p.Kind != certs.KindNode:
		return p, denied(fmt.Sprintf("%v is not a node", p))
	}
	return p, nil
}

// tlsState returns the TLS state of the connection a call came on.
func tlsState(ctx context.Context) (credentials.TLSInfo, bool) {
	pr, ok := peer.FromContext(ctx)
	if !ok || pr.AuthInfo == nil {
		return credentials.TLSInfo{}, false
	}
	ti, ok := pr.AuthInfo.(credentials.TLSInfo)
	return ti, ok
}
