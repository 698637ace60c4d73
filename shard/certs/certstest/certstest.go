// Package certstest makes certificate material for tests: a CA in a
// temporary directory, node and client certificates of it, and the
// material the tests of a refusal need (another CA's, an expired one).
// Its functions fail the test on any error; they are safe for concurrent
// use by one test's goroutines.
package certstest

import (
	"crypto/tls"
	"path/filepath"
	"testing"
	"time"

	"github.com/raftps/raftps/shard/certs"
)

// Dir is a certs directory with a CA, made by New.
type Dir struct {
	t    testing.TB
	Path string
	CA   *certs.Authority
}

// New makes a CA in a new temporary directory.
func New(t testing.TB) *Dir {
	t.Helper()
	path := t.TempDir()
	ca, err := certs.CreateCA(path, "raftps test CA", certs.Options{})
	if err != nil {
		t.Fatalf("create CA: %v", err)
	}
	return &Dir{t: t, Path: path, CA: ca}
}

// Node writes node id's certificate, for 127.0.0.1 and localhost, and
// returns its files.
func (d *Dir) Node(id string) certs.Files {
	d.t.Helper()
	return d.NodeValid(id, certs.Validity{})
}

// NodeValid is Node with the given validity (a past one for an expired
// certificate), overwriting an earlier certificate of id.
func (d *Dir) NodeValid(id string, v certs.Validity) certs.Files {
	d.t.Helper()
	if _, err := certs.CreateNode(d.Path, id, []string{"127.0.0.1", "localhost"}, certs.Options{Validity: v, Overwrite: true}); err != nil {
		d.t.Fatalf("create node %s: %v", id, err)
	}
	return certs.NodeFiles(d.Path, id)
}

// Client writes client name's certificate with role and returns its files.
func (d *Dir) Client(name string, role certs.Role) certs.Files {
	d.t.Helper()
	return d.ClientValid(name, role, certs.Validity{})
}

// ClientValid is Client with the given validity.
func (d *Dir) ClientValid(name string, role certs.Role, v certs.Validity) certs.Files {
	d.t.Helper()
	if _, err := certs.CreateClient(d.Path, name, role, certs.Options{Validity: v, Overwrite: true}); err != nil {
		d.t.Fatalf("create client %s: %v", name, err)
	}
	return certs.ClientFiles(d.Path, name)
}

// Expired is a validity that ended an hour ago.
func Expired() certs.Validity {
	return certs.Validity{NotBefore: time.Now().Add(-48 * time.Hour), Lifetime: 47 * time.Hour}
}

// CAOnly is the files of a party with the CA file and no certificate of
// its own (a client that authenticates by token).
func (d *Dir) CAOnly() certs.Files { return certs.Files{CA: filepath.Join(d.Path, certs.CACertFile)} }

// Source opens a Source on files that rereads them every 10 ms, failing
// the test on an error.
func Source(t testing.TB, f certs.Files, want certs.Identity) *certs.Source {
	t.Helper()
	s, err := certs.NewSource(f, certs.SourceOptions{Want: want, CheckEvery: 10 * time.Millisecond})
	if err != nil {
		t.Fatalf("source %s: %v", f.Cert, err)
	}
	return s
}

// Presenting is a dialer's TLS configuration that presents f's
// certificate whatever the server asks for and checks nothing of the
// server: what an attacker holding those files does.
func Presenting(f certs.Files) *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true, GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
		kp, err := tls.LoadX509KeyPair(f.Cert, f.Key)
		return &kp, err
	}}
}
