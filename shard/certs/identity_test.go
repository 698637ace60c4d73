package certs_test

import (
	"crypto/x509"
	"errors"
	"net/url"
	"testing"

	"github.com/raftps/raftps/shard/certs"
)

func TestParseRole(t *testing.T) {
	for _, s := range []string{"reader", "writer", "admin"} {
		r, err := certs.ParseRole(s)
		if err != nil || r.String() != s {
			t.Errorf("ParseRole(%q) = %v, %v", s, r, err)
		}
	}
	for _, s := range []string{"", "none", "Admin", "root"} {
		if _, err := certs.ParseRole(s); !errors.Is(err, certs.ErrInvalid) {
			t.Errorf("ParseRole(%q): %v, want ErrInvalid", s, err)
		}
	}
	if !certs.RoleAdmin.Allows(certs.RoleWriter) || certs.RoleReader.Allows(certs.RoleWriter) || certs.RoleNone.Allows(certs.RoleNone) {
		t.Error("roles are not ordered reader < writer < admin, or RoleNone allows something")
	}
}

func certWithURIs(uris ...string) *x509.Certificate {
	c := &x509.Certificate{}
	for _, s := range uris {
		u, err := url.Parse(s)
		if err != nil {
			panic(err)
		}
		c.URIs = append(c.URIs, u)
	}
	return c
}

// TestIdentityOf: the URI SAN is read back exactly, and anything else
// (two identities, a role on a node, a client without one, an unknown
// role or kind, a bad name) is no identity.
func TestIdentityOf(t *testing.T) {
	for _, id := range []certs.Identity{certs.NodeIdentity("n1"), certs.ClientIdentity("trainer", certs.RoleWriter), certs.ClientIdentity("ops.team-1", certs.RoleAdmin)} {
		got, err := certs.IdentityOf(&x509.Certificate{URIs: []*url.URL{id.URI()}})
		if err != nil || got != id {
			t.Errorf("IdentityOf(%s) = %v, %v; want %v", id.URI(), got, err, id)
		}
	}
	for _, uris := range [][]string{
		nil,
		{"spiffe://example.org/n1"},
		{"raftps://node/n1", "raftps://node/n2"},
		{"raftps://node/n1?role=admin"},
		{"raftps://client/trainer"},
		{"raftps://client/trainer?role=root"},
		{"raftps://client/trainer?role=admin&role=reader"},
		{"raftps://client/trainer?role=admin&x=1"},
		{"raftps://admin/n1"},
		{"raftps://node/"},
		{"raftps://node/a/b"},
		{"raftps://user@node/n1"},
	} {
		if id, err := certs.IdentityOf(certWithURIs(uris...)); !errors.Is(err, certs.ErrNoIdentity) {
			t.Errorf("IdentityOf(%v) = %v, %v; want ErrNoIdentity", uris, id, err)
		}
	}
	// Other URIs beside the identity do not matter.
	if id, err := certs.IdentityOf(certWithURIs("spiffe://x/y", "raftps://node/n3")); err != nil || id != certs.NodeIdentity("n3") {
		t.Errorf("beside a SPIFFE ID: %v, %v", id, err)
	}
}
