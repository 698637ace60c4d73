package certs

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
)

// The TLS configurations of a node's two listeners and of the two kinds of
// dialer. All of them speak TLS 1.3 only and take the Source's current
// material at every handshake, so renewed files apply to new connections.
// Servers disable session tickets: a resumed session would skip the
// certificate checks against a CA file that may have changed since.

// ClientListenerConfig is the server configuration of a node's client
// listener: the node's certificate; a client certificate is optional (a
// client may authenticate by token instead) but verified against the CA if
// presented. Which identities may call what is the business of the gRPC
// interceptors (package shard/auth), which can answer with a clear status.
func (s *Source) ClientListenerConfig() *tls.Config {
	return s.serverConfig(func(m *material) *tls.Config { return m.clientL })
}

// PeerListenerConfig is the server configuration of a node's peer
// listener: mutual TLS, and the client certificate must be a node's,
// signed by the CA. A client certificate is refused at the handshake.
func (s *Source) PeerListenerConfig() *tls.Config {
	return s.serverConfig(func(m *material) *tls.Config { return m.peerL })
}

func (s *Source) serverConfig(pick func(*material) *tls.Config) *tls.Config {
	return &tls.Config{
		MinVersion:             tls.VersionTLS13,
		SessionTicketsDisabled: true,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			m := s.material()
			if m.cert == nil {
				return nil, fmt.Errorf("%w: no certificate to serve with", ErrMaterial)
			}
			return pick(m), nil
		},
	}
}

// listenerConfigs builds the listeners' configurations of one generation
// of material.
func (s *Source) listenerConfigs(m *material) (client, peer *tls.Config) {
	if m.cert == nil {
		return nil, nil
	}
	base := tls.Config{
		MinVersion:             tls.VersionTLS13,
		SessionTicketsDisabled: true,
		Certificates:           []tls.Certificate{*m.cert},
		ClientCAs:              m.pool,
	}
	client, peer = base.Clone(), base.Clone()
	client.ClientAuth = tls.VerifyClientCertIfGiven
	peer.ClientAuth = tls.RequireAndVerifyClientCert
	peer.VerifyConnection = func(cs tls.ConnectionState) error {
		// Go has verified the chain against ClientCAs (and its validity
		// and client-auth usage) before this runs.
		id, err := verifiedIdentity(cs)
		if err == nil && id.Kind != KindNode {
			err = fmt.Errorf("%w: %v may not use the peer listener: only nodes may", ErrRefused, id)
		}
		return s.refused(err)
	}
	return client, peer
}

// VerifiedIdentity returns the identity of the verified certificate a TLS
// peer presented (a server: its client's; a dialer: its server's, if the
// config verified it): ErrRefused if it presented none or it was not
// verified, ErrNoIdentity if it carries none.
func VerifiedIdentity(cs tls.ConnectionState) (Identity, error) { return verifiedIdentity(cs) }

func verifiedIdentity(cs tls.ConnectionState) (Identity, error) {
	if len(cs.VerifiedChains) == 0 || len(cs.VerifiedChains[0]) == 0 {
		return Identity{}, fmt.Errorf("%w: no verified certificate", ErrRefused)
	}
	return IdentityOf(cs.VerifiedChains[0][0])
}

func (s *Source) refused(err error) error {
	if err != nil && s.opts.OnRefused != nil {
		s.opts.OnRefused(err)
	}
	return err
}

// DialConfig is the configuration of one dial of a node, by a client or
// a node, at host (its name or IP address, without port): the server must
// hold a certificate of the CA valid for host, and be a node (nodeID, if
// not empty: the node meant, as the dialer knows it from the cluster map);
// the dialer presents its own certificate if it has one (a node always
// has). The config is for this host only: TLS does not tell a dialer which
// IP address it dialed (no SNI for addresses), so the check needs it here.
// shard/auth's credentials make one per connection.
func (s *Source) DialConfig(host, nodeID string) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		ServerName: host,
		// The chain is verified by VerifyConnection, against the CA file
		// as it is at this handshake rather than a pool fixed now; nothing
		// is skipped.
		InsecureSkipVerify: true,
		VerifyConnection:   func(cs tls.ConnectionState) error { return s.verifyServer(cs, host, nodeID) },
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			if c := s.material().cert; c != nil {
				return c, nil
			}
			return &tls.Certificate{}, nil
		},
	}
}

// verifyServer checks a dialed server's certificate: signed by the CA,
// valid now, for server authentication, for host, and a node's; if nodeID
// is not empty, node nodeID's.
func (s *Source) verifyServer(cs tls.ConnectionState, host, nodeID string) error {
	if len(cs.PeerCertificates) == 0 {
		return s.refused(fmt.Errorf("%w: the server presented no certificate", ErrRefused))
	}
	if host == "" {
		return s.refused(fmt.Errorf("%w: no host name to check the server's certificate against", ErrRefused))
	}
	m := s.material()
	opts := x509.VerifyOptions{
		Roots:         m.pool,
		Intermediates: x509.NewCertPool(),
		DNSName:       host,
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, c := range cs.PeerCertificates[1:] {
		opts.Intermediates.AddCert(c)
	}
	leaf := cs.PeerCertificates[0]
	if _, err := leaf.Verify(opts); err != nil {
		return s.refused(fmt.Errorf("%w: server %s: %v", ErrRefused, host, err))
	}
	id, err := IdentityOf(leaf)
	switch {
	case err != nil:
		return s.refused(fmt.Errorf("server %s: %w", host, err))
	case id.Kind != KindNode:
		return s.refused(fmt.Errorf("%w: server %s is %v, not a node", ErrRefused, host, id))
	case nodeID != "" && id.Name != nodeID:
		return s.refused(fmt.Errorf("%w: server %s is node %s, not node %s as dialed", ErrRefused, host, id.Name, nodeID))
	}
	return nil
}
