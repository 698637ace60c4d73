package certs

import (
	"crypto/x509"
	"fmt"
	"net/url"
	"regexp"
)

// Kind is what a certificate speaks for: a node of the cluster or a client.
type Kind uint8

// The kinds of identity. A certificate without a raftps identity has none.
const (
	KindNode Kind = iota + 1
	KindClient
)

func (k Kind) String() string {
	switch k {
	case 0:
		return "none"
	case KindNode:
		return "node"
	case KindClient:
		return "client"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Role is what a client may do. Roles are ordered: each may do everything
// the ones below it may.
type Role uint8

// The roles. RoleNone is the zero value: no client has it, and it allows
// nothing.
const (
	RoleNone   Role = iota
	RoleReader      // pull, describe and list tables, status, the cluster map, jobs' state
	RoleWriter      // + push, join trainer jobs
	RoleAdmin       // + create and alter tables, drain and remove nodes, delete jobs
)

var roleNames = [...]string{RoleNone: "none", RoleReader: "reader", RoleWriter: "writer", RoleAdmin: "admin"}

func (r Role) String() string {
	if int(r) < len(roleNames) {
		return roleNames[r]
	}
	return fmt.Sprintf("role(%d)", uint8(r))
}

// MarshalText writes a kind as its name (JSON listings).
func (k Kind) MarshalText() ([]byte, error) { return []byte(k.String()), nil }

// MarshalText writes a role as its name (JSON listings).
func (r Role) MarshalText() ([]byte, error) { return []byte(r.String()), nil }

// Allows reports whether a caller of role r may make a call that needs
// role min.
func (r Role) Allows(min Role) bool { return r != RoleNone && r >= min }

// ParseRole parses reader, writer or admin.
func ParseRole(s string) (Role, error) {
	for r := RoleReader; r <= RoleAdmin; r++ {
		if roleNames[r] == s {
			return r, nil
		}
	}
	return RoleNone, fmt.Errorf("%w: role %q: want reader, writer or admin", ErrInvalid, s)
}

// Identity is who a certificate speaks for: node Name, or client Name with
// its Role. It is carried in the certificate as one URI SAN (the only
// thing read back; the subject's CN repeats the name for people):
//
//	raftps://node/<id>
//	raftps://client/<name>?role=<reader|writer|admin>
type Identity struct {
	Kind Kind   `json:"kind"`
	Name string `json:"name"`
	Role Role   `json:"role"` // clients only
}

// URI scheme and hosts of identity URIs. Part of the certificate format:
// certificates issued by one version are read by the next.
const (
	uriScheme  = "raftps"
	hostNode   = "node"
	hostClient = "client"
)

// nameRE is what node IDs and client names may be: short, printable, no
// separators a URI, a file name or a log line would misread.
var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// CheckName returns an error unless s may name a node or a client.
func CheckName(s string) error {
	if !nameRE.MatchString(s) {
		return fmt.Errorf("%w: name %q: want 1 to 63 letters, digits, '.', '_' or '-', starting with a letter or digit", ErrInvalid, s)
	}
	return nil
}

// NodeIdentity is the identity of node id.
func NodeIdentity(id string) Identity { return Identity{Kind: KindNode, Name: id} }

// ClientIdentity is the identity of client name with role.
func ClientIdentity(name string, role Role) Identity {
	return Identity{Kind: KindClient, Name: name, Role: role}
}

// Check returns an error unless i is a well-formed identity.
func (i Identity) Check() error {
	if err := CheckName(i.Name); err != nil {
		return err
	}
	switch i.Kind {
	case KindNode:
		if i.Role != RoleNone {
			return fmt.Errorf("%w: node %s: nodes have no role", ErrInvalid, i.Name)
		}
	case KindClient:
		if i.Role < RoleReader || i.Role > RoleAdmin {
			return fmt.Errorf("%w: client %s: %v is not a role", ErrInvalid, i.Name, i.Role)
		}
	default:
		return fmt.Errorf("%w: %v is not a kind of identity", ErrInvalid, i.Kind)
	}
	return nil
}

// URI is the identity's URI SAN.
func (i Identity) URI() *url.URL {
	u := &url.URL{Scheme: uriScheme, Path: "/" + i.Name}
	if i.Kind == KindNode {
		u.Host = hostNode
	} else {
		u.Host = hostClient
		u.RawQuery = url.Values{"role": {i.Role.String()}}.Encode()
	}
	return u
}

func (i Identity) String() string {
	switch i.Kind {
	case KindNode:
		return "node " + i.Name
	case KindClient:
		return fmt.Sprintf("client %s (%v)", i.Name, i.Role)
	}
	return "no identity"
}

// IdentityOf reads the identity a certificate carries. It checks the
// format only: whether the certificate is valid and signed by the cluster's
// CA is the TLS layer's business (see Source), and callers take identities
// only from verified chains.
func IdentityOf(cert *x509.Certificate) (Identity, error) {
	var found []*url.URL
	for _, u := range cert.URIs {
		if u.Scheme == uriScheme {
			found = append(found, u)
		}
	}
	if len(found) != 1 {
		return Identity{}, fmt.Errorf("%w: certificate %q has %d raftps identity URIs, want 1", ErrNoIdentity, cert.Subject.CommonName, len(found))
	}
	u := found[0]
	name := u.Path
	if len(name) > 0 && name[0] == '/' {
		name = name[1:]
	}
	var id Identity
	switch u.Host {
	case hostNode:
		if u.RawQuery != "" {
			return Identity{}, fmt.Errorf("%w: %s: a node identity takes no query", ErrNoIdentity, u)
		}
		id = NodeIdentity(name)
	case hostClient:
		q, err := url.ParseQuery(u.RawQuery)
		if err != nil || len(q) != 1 || len(q["role"]) != 1 {
			return Identity{}, fmt.Errorf("%w: %s: a client identity names one role (?role=...)", ErrNoIdentity, u)
		}
		role, err := ParseRole(q.Get("role"))
		if err != nil {
			return Identity{}, fmt.Errorf("%w: %s: %v", ErrNoIdentity, u, err)
		}
		id = ClientIdentity(name, role)
	default:
		return Identity{}, fmt.Errorf("%w: %s: neither a node nor a client", ErrNoIdentity, u)
	}
	if u.User != nil || u.Fragment != "" || u.Opaque != "" {
		return Identity{}, fmt.Errorf("%w: %s: unexpected URI parts", ErrNoIdentity, u)
	}
	if err := id.Check(); err != nil {
		return Identity{}, fmt.Errorf("%w: %s: %v", ErrNoIdentity, u, err)
	}
	return id, nil
}
