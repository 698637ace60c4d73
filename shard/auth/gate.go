package auth

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"strings"

	"github.com/raftps/raftps/shard/certs"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
)

// Config configures a Gate.
type Config struct {
	// Source is the node's certificate material: the listener serves TLS
	// with it (certs.Source.ClientListenerConfig or PeerListenerConfig).
	// Required unless Insecure.
	Source *certs.Source
	// Insecure: the listener is plaintext and authenticates nobody; every
	// caller may do everything (raftps server --insecure).
	Insecure bool
	// Tokens finds bearer tokens' records (client listener only; nil: no
	// token is accepted).
	Tokens TokenStore
	// OnRefused, if set, is told of every refused call (for the node's
	// log). Called on the call's goroutine: it must not block.
	OnRefused func(method string, err error)
}

// Gate is one listener's authentication and authorization: its transport
// credentials and interceptors (ServerOptions). Each call is let through
// only once the gate knows its caller, with the Principal on its context;
// a refused call never reaches its handler.
type Gate struct {
	creds     credentials.TransportCredentials // nil: insecure
	check     func(ctx context.Context, method string) (Principal, error)
	onRefused func(string, error)
}

// NewClientGate is the gate of a node's client listener: callers present
// a client certificate or a bearer token (one of them), and each method
// needs the role MinRole names. A node's certificate is not a client
// credential.
func NewClientGate(cfg Config) (*Gate, error) {
	g, err := newGate(cfg, (*certs.Source).ClientListenerConfig)
	if err != nil {
		return nil, fmt.Errorf("client gate: %w", err)
	}
	g.check = func(ctx context.Context, method string) (Principal, error) {
		if cfg.Insecure {
			return Principal{Insecure: true, Identity: certs.Identity{Role: certs.RoleAdmin}}, nil
		}
		p, err := authenticateClient(ctx, cfg.Tokens)
		if err != nil {
			return p, err
		}
		need, ok := MinRole(method)
		switch {
		case !ok:
			return p, denied(fmt.Sprintf("%s is not a method of the client API that anyone may call", method))
		case !p.Role.Allows(need):
			return p, denied(fmt.Sprintf("%v may not call %s: it needs role %v", p, shortMethod(method), need))
		}
		return p, nil
	}
	return g, nil
}

// NewPeerGate is the gate of a node's peer listener: callers are nodes
// of the cluster's CA (the TLS configuration refuses anyone else at the
// handshake; the gate checks again). What a node may say in a message is
// for the handlers to check, with NodeID, RequireNode and RequireMember.
func NewPeerGate(cfg Config) (*Gate, error) {
	if cfg.Tokens != nil {
		return nil, fmt.Errorf("peer gate: the peer listener takes no tokens")
	}
	g, err := newGate(cfg, (*certs.Source).PeerListenerConfig)
	if err != nil {
		return nil, fmt.Errorf("peer gate: %w", err)
	}
	g.check = func(ctx context.Context, _ string) (Principal, error) {
		if cfg.Insecure {
			return Principal{Insecure: true}, nil
		}
		ti, ok := tlsState(ctx)
		if !ok {
			return Principal{}, unauthenticated("the peer API is served over TLS only")
		}
		id, err := certs.VerifiedIdentity(ti.State)
		if err != nil {
			return Principal{}, unauthenticated("peer API: " + err.Error())
		}
		if id.Kind != certs.KindNode {
			return Principal{Identity: id}, denied(fmt.Sprintf("%v may not call the peer API: only nodes may", id))
		}
		return Principal{Identity: id}, nil
	}
	return g, nil
}

func newGate(cfg Config, tlsConfig func(*certs.Source) *tls.Config) (*Gate, error) {
	g := &Gate{onRefused: cfg.OnRefused}
	switch {
	case cfg.Insecure && cfg.Source != nil:
		return nil, errors.New("both insecure and a certificate source")
	case cfg.Insecure:
	case cfg.Source == nil:
		return nil, errors.New("no certificate source (and not insecure)")
	default:
		g.creds = Coalesced(credentials.NewTLS(tlsConfig(cfg.Source)))
	}
	return g, nil
}

// ServerOptions are the gate's options of its listener's grpc.Server: the
// transport credentials (none when insecure) and the interceptors. Put
// them before other interceptors, so that nothing runs for a call the gate
// refuses.
func (g *Gate) ServerOptions() []grpc.ServerOption {
	opts := []grpc.ServerOption{grpc.ChainUnaryInterceptor(g.unary), grpc.ChainStreamInterceptor(g.stream)}
	if g.creds != nil {
		opts = append(opts, grpc.Creds(g.creds))
	}
	return opts
}

// Check authenticates and authorizes a call of method on ctx, as the
// interceptors do: the context with the caller on it, or the refusal.
func (g *Gate) Check(ctx context.Context, method string) (context.Context, error) {
	p, err := g.check(ctx, method)
	if err != nil {
		if g.onRefused != nil {
			g.onRefused(method, err)
		}
		return nil, err
	}
	return WithPrincipal(ctx, p), nil
}

func (g *Gate) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	ctx, err := g.Check(ctx, info.FullMethod)
	if err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

func (g *Gate) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	ctx, err := g.Check(ss.Context(), info.FullMethod)
	if err != nil {
		return err
	}
	return handler(srv, ctxStream{ss, ctx})
}

// ctxStream is a server stream whose handler sees the gate's context.
type ctxStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s ctxStream) Context() context.Context { return s.ctx }

// authenticateClient finds who calls the client API: a client by its
// verified certificate or by its bearer token, never both.
func authenticateClient(ctx context.Context, tokens TokenStore) (Principal, error) {
	ti, ok := tlsState(ctx)
	if !ok {
		return Principal{}, unauthenticated("the client API is served over TLS only")
	}
	tok, hasTok, err := bearerOf(ctx)
	if err != nil {
		return Principal{}, err
	}
	switch {
	case len(ti.State.VerifiedChains) > 0:
		if hasTok {
			return Principal{}, unauthenticated("both a client certificate and a bearer token were presented: present one")
		}
		id, err := certs.VerifiedIdentity(ti.State)
		if err != nil {
			return Principal{}, unauthenticated("client certificate: " + err.Error())
		}
		if id.Kind != certs.KindNode {
			return Principal{Identity: id}, nil
		}
		return Principal{Identity: id}, denied(fmt.Sprintf("the certificate of node %s is not a client credential: use a client certificate or a token", id.Name))
	case len(ti.State.PeerCertificates) > 0:
		// The TLS configuration verifies every certificate given.
		return Principal{}, unauthenticated("the client certificate was not verified")
	case !hasTok:
		return Principal{}, unauthenticated("no client certificate or bearer token: present one")
	case tokens == nil:
		return Principal{}, unauthenticated("this node accepts no bearer tokens")
	}
	return VerifyToken(tokens, tok)
}

// bearerOf returns the bearer token of the call's authorization metadata.
func bearerOf(ctx context.Context) (string, bool, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	vals := md.Get("authorization")
	switch len(vals) {
	case 0:
		return "", false, nil
	case 1:
	default:
		return "", false, unauthenticated(fmt.Sprintf("%d authorization headers: send one", len(vals)))
	}
	scheme, tok, ok := strings.Cut(vals[0], " ")
	if !ok || !strings.EqualFold(scheme, "bearer") || strings.TrimSpace(tok) == "" {
		return "", false, unauthenticated("authorization header: want \"Bearer TOKEN\"")
	}
	return strings.TrimSpace(tok), true, nil
}

// shortMethod is "Service/Method" of "/package.Service/Method".
func shortMethod(m string) string {
	if i := strings.LastIndex(m, "."); i >= 0 {
		return m[i+1:]
	}
	return m
}
