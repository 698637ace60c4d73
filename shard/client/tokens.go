package client

import (
	"context"
	"fmt"

	"github.com/raftps/raftps/shard/shardpb"
)

// Token is what a cluster shows of a bearer token: never its secret.
type Token struct {
	// ID is the token's 16 hex digits (the token is rpst_ID_SECRET).
	ID   string `json:"id"`
	Name string `json:"name"`
	// Role is "reader", "writer" or "admin".
	Role string `json:"role"`
}

func tokenOf(t *shardpb.TokenInfo) Token {
	return Token{ID: t.GetId(), Name: t.GetName(), Role: t.GetRole()}
}

// CreateToken makes a bearer token named name with role ("reader",
// "writer" or "admin"; the caller must be an admin) and returns it, the
// only time anyone sees it: the cluster keeps its hash. pending names the
// nodes that had not applied it when the call answered (they accept it
// once they catch up). A name in use is ErrTokenExists; that is also what
// a retry finds after an unknown outcome whose creation went through:
// revoke the name and create again.
func (a *Admin) CreateToken(ctx context.Context, name, role string) (token string, info Token, pending []string, err error) {
	var resp *shardpb.CreateTokenResponse
	err = a.c.callMeta(ctx, func(ctx context.Context, s shardpb.ParameterServerClient) error {
		var err error
		resp, err = s.CreateToken(ctx, &shardpb.CreateTokenRequest{Name: name, Role: role})
		return err
	})
	if err != nil {
		return "", Token{}, nil, fmt.Errorf("creating token %q: %w", name, err)
	}
	return resp.Token, tokenOf(resp.Info), resp.Pending, nil
}

// Tokens lists the cluster's bearer tokens, sorted by name (admin only).
func (a *Admin) Tokens(ctx context.Context) ([]Token, error) {
	var resp *shardpb.ListTokensResponse
	err := a.c.callMeta(ctx, func(ctx context.Context, s shardpb.ParameterServerClient) error {
		var err error
		resp, err = s.ListTokens(ctx, &shardpb.ListTokensRequest{})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("listing tokens: %w", err)
	}
	out := make([]Token, len(resp.Tokens))
	for i, t := range resp.Tokens {
		out[i] = tokenOf(t)
	}
	return out, nil
}

// RevokeToken deletes the bearer token whose ID or name is idOrName (admin
// only): every node refuses it once its metadata replica has applied the
// revocation, which the call waits for; pending names the nodes that had
// not when it answered. An unknown token is ErrUnknownToken.
func (a *Admin) RevokeToken(ctx context.Context, idOrName string) (revoked Token, pending []string, err error) {
	var resp *shardpb.DeleteTokenResponse
	err = a.c.callMeta(ctx, func(ctx context.Context, s shardpb.ParameterServerClient) error {
		var err error
		resp, err = s.DeleteToken(ctx, &shardpb.DeleteTokenRequest{Token: idOrName})
		return err
	})
	if err != nil {
		return Token{}, nil, fmt.Errorf("revoking token %q: %w", idOrName, err)
	}
	return tokenOf(resp.Deleted), resp.Pending, nil
}
