package auth

import (
	"context"
	"errors"
	"net"

	"github.com/raftps/raftps/shard/certs"
	"google.golang.org/grpc/credentials"
)

// ClientCredentials are the transport credentials of a client of the
// client API (grpc.WithTransportCredentials): TLS 1.3, the server must be
// a node of src's CA whose certificate names the host dialed, and the
// client presents src's certificate if it has one. For a token, add
// grpc.WithPerRPCCredentials(BearerToken(tok)).
func ClientCredentials(src *certs.Source) credentials.TransportCredentials {
	return Coalesced(&dialCreds{src: src})
}

// NodeCredentials are the transport credentials of a node dialing its
// peers: as ClientCredentials, presenting the node's certificate, and the
// server must be the node nodeAt names for the address dialed (the dial's
// authority, host:port: the peer address the node dials). nodeAt returns ""
// where it does not know (a --join address): any node of the CA is
// accepted there.
func NodeCredentials(src *certs.Source, nodeAt func(addr string) string) credentials.TransportCredentials {
	return Coalesced(&dialCreds{src: src, nodeAt: nodeAt})
}

// dialCreds make a TLS configuration per connection, since which host and
// which node it must find there depends on the address dialed.
type dialCreds struct {
	src        *certs.Source
	nodeAt     func(string) string
	serverName string // OverrideServerName's
}

func (c *dialCreds) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	host, _, err := net.SplitHostPort(authority)
	if err != nil {
		host = authority
	}
	if c.serverName != "" {
		host = c.serverName
	}
	var id string
	if c.nodeAt != nil {
		id = c.nodeAt(authority)
	}
	return credentials.NewTLS(c.src.DialConfig(host, id)).ClientHandshake(ctx, authority, raw)
}

func (c *dialCreds) ServerHandshake(net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("dial credentials cannot serve: use a Gate's server options")
}

func (c *dialCreds) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "tls"}
}

func (c *dialCreds) Clone() credentials.TransportCredentials {
	cp := *c
	return &cp
}

// OverrideServerName is gRPC's deprecated hook; grpc.WithAuthority is the
// way to dial a name other than the address.
func (c *dialCreds) OverrideServerName(name string) error {
	c.serverName = name
	return nil
}
