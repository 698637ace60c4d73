package certs

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"strings"
	"time"
)

// Default lifetimes. A CA outlives the certificates it signs; node and
// client certificates are renewed in place (Source picks renewed files up
// without a restart), so they can be shorter.
const (
	DefaultCALifetime     = 10 * 365 * 24 * time.Hour
	DefaultNodeLifetime   = 2 * 365 * 24 * time.Hour
	DefaultClientLifetime = 365 * 24 * time.Hour
	// clockSkew backdates NotBefore so that a certificate made on one
	// machine is valid at once on another whose clock is a little behind.
	clockSkew = 5 * time.Minute
)

// Validity is when a certificate is valid: from NotBefore (zero: now,
// minus a few minutes for clock skew) for Lifetime (zero: the kind's
// default). A certificate never outlives the CA that signs it: a longer
// lifetime is cut to the CA's expiry.
type Validity struct {
	NotBefore time.Time
	Lifetime  time.Duration
}

func (v Validity) span(def time.Duration) (time.Time, time.Time, error) {
	from := v.NotBefore
	if from.IsZero() {
		from = time.Now().Add(-clockSkew)
	}
	life := v.Lifetime
	if life == 0 {
		life = def
	}
	if life < 0 {
		return time.Time{}, time.Time{}, fmt.Errorf("%w: lifetime %v is negative", ErrInvalid, life)
	}
	return from.UTC().Truncate(time.Second), from.Add(life).UTC().Truncate(time.Second), nil
}

// Authority is a certificate authority in memory: its certificate and its
// key. It signs node and client certificates.
type Authority struct {
	Cert *x509.Certificate
	key  crypto.Signer
}

// Issued is a certificate just signed, with its key, as PEM.
type Issued struct {
	Cert    *x509.Certificate
	CertPEM []byte
	KeyPEM  []byte
}

// NewAuthority creates a self-signed CA (ECDSA P-256) named name, which
// may sign end-entity certificates only (no intermediates).
func NewAuthority(name string, v Validity) (*Authority, error) {
	if strings.TrimSpace(name) == "" {
		return nil, fmt.Errorf("%w: the CA needs a name", ErrInvalid)
	}
	from, to, err := v.span(DefaultCALifetime)
	if err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("CA key: %w", err)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: name, Organization: []string{"raftps"}},
		NotBefore:             from,
		NotAfter:              to,
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("CA certificate: %w", err)
	}
	return &Authority{Cert: cert, key: key}, nil
}

// ParseAuthority reads a CA from its certificate and key (PEM).
func ParseAuthority(certPEM, keyPEM []byte) (*Authority, error) {
	cert, err := parseCertPEM(certPEM)
	if err != nil {
		return nil, err
	}
	if !cert.IsCA {
		return nil, fmt.Errorf("%w: %q is not a CA certificate", ErrMaterial, cert.Subject.CommonName)
	}
	key, err := parseKeyPEM(keyPEM)
	if err != nil {
		return nil, err
	}
	if !publicKeysEqual(cert.PublicKey, key.Public()) {
		return nil, fmt.Errorf("%w: the CA key does not belong to the CA certificate %q", ErrMaterial, cert.Subject.CommonName)
	}
	return &Authority{Cert: cert, key: key}, nil
}

// CertPEM is the CA's certificate as PEM: what every node and client
// trusts.
func (a *Authority) CertPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: a.Cert.Raw})
}

// KeyPEM is the CA's key as PEM (PKCS #8).
func (a *Authority) KeyPEM() ([]byte, error) { return keyPEM(a.key) }

// IssueNode signs a certificate for node id, valid for the hosts (DNS
// names or IP addresses, no ports) clients and peers reach it by. It serves
// both ends of a connection (server and client authentication), since nodes
// dial each other.
func (a *Authority) IssueNode(id string, hosts []string, v Validity) (*Issued, error) {
	if len(hosts) == 0 {
		return nil, fmt.Errorf("%w: node %s: give at least one host (its address or name, as clients and peers dial it)", ErrInvalid, id)
	}
	return a.issue(NodeIdentity(id), hosts, v, DefaultNodeLifetime,
		[]x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth})
}

// IssueClient signs a certificate for client name with role. It
// authenticates a client to nodes only: it cannot serve a connection.
func (a *Authority) IssueClient(name string, role Role, v Validity) (*Issued, error) {
	return a.issue(ClientIdentity(name, role), nil, v, DefaultClientLifetime,
		[]x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth})
}

func (a *Authority) issue(id Identity, hosts []string, v Validity, def time.Duration, usage []x509.ExtKeyUsage) (*Issued, error) {
	if err := id.Check(); err != nil {
		return nil, err
	}
	from, to, err := v.span(def)
	if err != nil {
		return nil, err
	}
	if to.After(a.Cert.NotAfter) {
		to = a.Cert.NotAfter
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("%v key: %w", id, err)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: id.Name, Organization: []string{"raftps"}, OrganizationalUnit: []string{id.Kind.String()}},
		NotBefore:    from,
		NotAfter:     to,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  usage,
		URIs:         []*url.URL{id.URI()},
	}
	for _, h := range hosts {
		h = strings.TrimSpace(h)
		switch {
		case h == "":
			continue
		case net.ParseIP(h) != nil:
			tmpl.IPAddresses = append(tmpl.IPAddresses, net.ParseIP(h))
		case strings.ContainsAny(h, ":/ ") || strings.HasPrefix(h, "*"):
			return nil, fmt.Errorf("%w: host %q: want a DNS name or an IP address, without port or wildcard", ErrInvalid, h)
		default:
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.Cert, key.Public(), a.key)
	if err != nil {
		return nil, fmt.Errorf("%v certificate: %w", id, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("%v certificate: %w", id, err)
	}
	kp, err := keyPEM(key)
	if err != nil {
		return nil, err
	}
	return &Issued{Cert: cert, CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), KeyPEM: kp}, nil
}

func newSerial() (*big.Int, error) {
	s, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("serial number: %w", err)
	}
	return s.Add(s, big.NewInt(1)), nil
}

func keyPEM(key crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("encode key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// parseCertPEM parses the first certificate of a PEM file.
func parseCertPEM(b []byte) (*x509.Certificate, error) {
	certs, err := parseCertsPEM(b)
	if err != nil {
		return nil, err
	}
	return certs[0], nil
}

// parseCertsPEM parses every certificate of a PEM file (a CA file may
// hold several while a CA is rotated); anything else in it is an error.
func parseCertsPEM(b []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			break
		}
		if blk.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("%w: a PEM block of type %q where certificates were expected", ErrMaterial, blk.Type)
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrMaterial, err)
		}
		out = append(out, c)
	}
	if len(strings.TrimSpace(string(b))) != 0 {
		return nil, fmt.Errorf("%w: text that is not PEM after the certificates", ErrMaterial)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: no certificate", ErrMaterial)
	}
	return out, nil
}

func parseKeyPEM(b []byte) (crypto.Signer, error) {
	blk, _ := pem.Decode(b)
	if blk == nil {
		return nil, fmt.Errorf("%w: no PEM key", ErrMaterial)
	}
	var k any
	var err error
	switch blk.Type {
	case "PRIVATE KEY":
		k, err = x509.ParsePKCS8PrivateKey(blk.Bytes)
	case "EC PRIVATE KEY":
		k, err = x509.ParseECPrivateKey(blk.Bytes)
	default:
		return nil, fmt.Errorf("%w: a PEM block of type %q where a private key was expected", ErrMaterial, blk.Type)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: key: %v", ErrMaterial, err)
	}
	s, ok := k.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("%w: key of type %T cannot sign", ErrMaterial, k)
	}
	return s, nil
}

func publicKeysEqual(a, b crypto.PublicKey) bool {
	e, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && e.Equal(b)
}
