package certs

import (
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// The files of a certs directory. One directory can hold the CA, every
// node's and every client's material (what `raftps cluster up` makes); a
// production node gets a directory with ca.crt, its own node files and
// gossip.key only, and the CA key stays elsewhere.
const (
	CACertFile    = "ca.crt"
	CAKeyFile     = "ca.key"
	GossipKeyFile = "gossip.key"
)

// GossipKeyBytes is the gossip key's size: AES-256, the largest key
// memberlist takes.
const GossipKeyBytes = 32

// Files names the material of one party: the CA certificates it trusts,
// and its own certificate and key (empty for a client that authenticates by
// token).
type Files struct {
	CA, Cert, Key string
}

// NodeFiles are node id's files in dir: ca.crt, node.ID.crt, node.ID.key.
func NodeFiles(dir, id string) Files {
	return Files{CA: filepath.Join(dir, CACertFile), Cert: filepath.Join(dir, "node."+id+".crt"), Key: filepath.Join(dir, "node."+id+".key")}
}

// ClientFiles are client name's files in dir: ca.crt, client.NAME.crt,
// client.NAME.key.
func ClientFiles(dir, name string) Files {
	return Files{CA: filepath.Join(dir, CACertFile), Cert: filepath.Join(dir, "client."+name+".crt"), Key: filepath.Join(dir, "client."+name+".key")}
}

// Options are how the Create functions write: validity, and whether they
// may replace existing files (by default they refuse, naming the file).
type Options struct {
	Validity
	Overwrite bool
}

// CreateCA makes a new CA named name in dir (created 0700 if missing):
// ca.crt, ca.key and a new gossip key, gossip.key, written together or not
// at all.
func CreateCA(dir, name string, o Options) (*Authority, error) {
	ca, err := NewAuthority(name, o.Validity)
	if err != nil {
		return nil, err
	}
	key, err := ca.KeyPEM()
	if err != nil {
		return nil, err
	}
	gk, err := NewGossipKey()
	if err != nil {
		return nil, err
	}
	enc := []byte(base64.StdEncoding.EncodeToString(gk) + "\n")
	err = writeAll(dir, o.Overwrite, []file{{CACertFile, ca.CertPEM(), 0o644}, {CAKeyFile, key, 0o600}, {GossipKeyFile, enc, 0o600}})
	if err != nil {
		return nil, err
	}
	return ca, nil
}

// CreateNode signs node id's certificate for hosts with the CA in dir and
// writes node.ID.crt and node.ID.key there.
func CreateNode(dir, id string, hosts []string, o Options) (*Issued, error) {
	return issueInto(NodeFiles(dir, id), o, func(ca *Authority) (*Issued, error) { return ca.IssueNode(id, hosts, o.Validity) })
}

// CreateClient signs client name's certificate with role using the CA in
// dir and writes client.NAME.crt and client.NAME.key there.
func CreateClient(dir, name string, role Role, o Options) (*Issued, error) {
	return issueInto(ClientFiles(dir, name), o, func(ca *Authority) (*Issued, error) { return ca.IssueClient(name, role, o.Validity) })
}

// issueInto signs with the CA beside f.CA and writes f.Cert and f.Key.
func issueInto(f Files, o Options, issue func(*Authority) (*Issued, error)) (*Issued, error) {
	dir := filepath.Dir(f.CA)
	ca, err := LoadAuthority(dir)
	if err != nil {
		return nil, err
	}
	is, err := issue(ca)
	if err != nil {
		return nil, err
	}
	return is, writeAll(dir, o.Overwrite, []file{{filepath.Base(f.Cert), is.CertPEM, 0o644}, {filepath.Base(f.Key), is.KeyPEM, 0o600}})
}

// LoadAuthority reads the CA of dir (ca.crt and ca.key).
func LoadAuthority(dir string) (*Authority, error) {
	certPEM, err := os.ReadFile(filepath.Join(dir, CACertFile))
	if err != nil {
		return nil, fmt.Errorf("%w in %s: %v (create one with raftps cert create-ca)", ErrNoCA, dir, err)
	}
	keyPEM, err := os.ReadFile(filepath.Join(dir, CAKeyFile))
	if err != nil {
		return nil, fmt.Errorf("%w in %s: %v (the CA key is needed to sign)", ErrNoCA, dir, err)
	}
	ca, err := ParseAuthority(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	return ca, nil
}

// NewGossipKey returns a new random gossip key.
func NewGossipKey() ([]byte, error) {
	k := make([]byte, GossipKeyBytes)
	if _, err := rand.Read(k); err != nil {
		return nil, fmt.Errorf("gossip key: %w", err)
	}
	return k, nil
}

// LoadGossipKeys reads a gossip key file: one key a line, in standard
// base64. The first is the key gossip is sent with; every key is accepted
// on receipt, so that the key can be changed by rolling restarts (add the
// new key as the second line everywhere, then make it the first, then drop
// the old one). memberlist.NewKeyring(keys[1:], keys[0]) is its keyring.
func LoadGossipKeys(path string) ([][]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%w: gossip key: %v", ErrMaterial, err)
	}
	var keys [][]byte
	for i, line := range strings.Split(string(b), "\n") {
		if line = strings.TrimSpace(line); line == "" {
			continue
		}
		k, err := base64.StdEncoding.DecodeString(line)
		if err != nil {
			return nil, fmt.Errorf("%w: gossip key %s, line %d: not base64: %v", ErrMaterial, path, i+1, err)
		}
		if len(k) != GossipKeyBytes {
			return nil, fmt.Errorf("%w: gossip key %s, line %d: %d bytes, want %d", ErrMaterial, path, i+1, len(k), GossipKeyBytes)
		}
		keys = append(keys, k)
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("%w: gossip key %s: no key", ErrMaterial, path)
	}
	return keys, nil
}

type file struct {
	name string
	data []byte
	mode os.FileMode
}

// writeAll writes files into dir. Without overwrite it refuses before
// writing anything if one exists. Each file is written to a temporary name
// and renamed, so a reader (a node's Source) sees the old file or the new
// one, never a part.
func writeAll(dir string, overwrite bool, files []file) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("certs dir: %w", err)
	}
	if !overwrite {
		for _, f := range files {
			p := filepath.Join(dir, f.name)
			if _, err := os.Lstat(p); err == nil {
				return fmt.Errorf("%s: %w (give --overwrite to replace it)", p, ErrExists)
			} else if !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("%s: %w", p, err)
			}
		}
	}
	for _, f := range files {
		if err := writeFile(filepath.Join(dir, f.name), f.data, f.mode); err != nil {
			return err
		}
	}
	return nil
}

func writeFile(path string, data []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(tmp.Name())
	// Chmod before the bytes go in: a key is never readable by others,
	// not even for a moment.
	err = tmp.Chmod(mode)
	if err == nil {
		_, err = tmp.Write(data)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// Entry describes one certificate file of a certs directory.
type Entry struct {
	File     string    `json:"file"`
	CA       bool      `json:"ca"`
	Identity Identity  `json:"identity"` // zero for a CA or a certificate without one
	Hosts    []string  `json:"hosts"`    // DNS names and IP addresses
	NotAfter time.Time `json:"not_after"`
	// Problem says why the certificate would be refused now (expired, not
	// yet valid, not signed by the directory's ca.crt, no identity, no key
	// file beside it, a key readable by others); empty if none.
	Problem string `json:"problem"`
}

// List describes every certificate (*.crt) in dir, CA first, then by file
// name, each checked against the directory's ca.crt at now.
func List(dir string, now time.Time) ([]Entry, error) {
	names, err := filepath.Glob(filepath.Join(dir, "*.crt"))
	if err != nil {
		return nil, err
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("%s: no certificates (*.crt)", dir)
	}
	sort.Strings(names)
	var cas []*x509.Certificate
	if b, err := os.ReadFile(filepath.Join(dir, CACertFile)); err == nil {
		cas, _ = parseCertsPEM(b)
	}
	var out []Entry
	for _, n := range names {
		out = append(out, describe(n, cas, now))
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].CA && !out[j].CA })
	return out, nil
}

func describe(path string, cas []*x509.Certificate, now time.Time) Entry {
	e := Entry{File: filepath.Base(path)}
	b, err := os.ReadFile(path)
	if err != nil {
		e.Problem = err.Error()
		return e
	}
	c, err := parseCertPEM(b)
	if err != nil {
		e.Problem = err.Error()
		return e
	}
	e.CA, e.NotAfter = c.IsCA, c.NotAfter
	e.Hosts = append(e.Hosts, c.DNSNames...)
	for _, ip := range c.IPAddresses {
		e.Hosts = append(e.Hosts, ip.String())
	}
	var problems []string
	switch {
	case now.After(c.NotAfter):
		problems = append(problems, "expired")
	case now.Before(c.NotBefore):
		problems = append(problems, "not valid before "+c.NotBefore.Format(time.RFC3339))
	}
	if !e.CA {
		if e.Identity, err = IdentityOf(c); err != nil {
			problems = append(problems, err.Error())
		}
		// Whether a CA of the file signed it, apart from when: expiry
		// is reported above.
		signed := false
		for _, ca := range cas {
			signed = signed || c.CheckSignatureFrom(ca) == nil
		}
		if len(cas) == 0 {
			problems = append(problems, "no usable "+CACertFile+" to check it against")
		} else if !signed {
			problems = append(problems, "not signed by "+CACertFile)
		}
	}
	key := strings.TrimSuffix(path, ".crt") + ".key"
	if st, err := os.Stat(key); err != nil {
		if !e.CA {
			problems = append(problems, "no key file "+filepath.Base(key))
		}
	} else if st.Mode().Perm()&0o077 != 0 {
		problems = append(problems, fmt.Sprintf("key %s readable by others (mode %v)", filepath.Base(key), st.Mode().Perm()))
	}
	e.Problem = strings.Join(problems, "; ")
	return e
}

// NodeMaterial names a node's material: a certs directory as raftps cert
// writes it (ca.crt, node.ID.crt, node.ID.key, gossip.key), or each file by
// itself, which wins over the directory's.
type NodeMaterial struct {
	Dir, CA, Cert, Key, GossipKey string
}

// Named says whether any of the material is named.
func (m NodeMaterial) Named() bool {
	return m.Dir != "" || m.CA != "" || m.Cert != "" || m.Key != "" || m.GossipKey != ""
}

// Load opens node id's material: its certificates, as a Source that must
// name the node (o.Want is set to it), and its gossip keys. Without Dir,
// every file must be named.
func (m NodeMaterial) Load(id string, o SourceOptions) (*Source, [][]byte, error) {
	files, gossip := NodeFiles(m.Dir, id), filepath.Join(m.Dir, GossipKeyFile)
	for _, f := range []struct{ given, dst *string }{{&m.CA, &files.CA}, {&m.Cert, &files.Cert}, {&m.Key, &files.Key}, {&m.GossipKey, &gossip}} {
		if *f.given != "" {
			*f.dst = *f.given
		} else if m.Dir == "" {
			return nil, nil, fmt.Errorf("%w: without a certs directory, the CA, certificate, key and gossip key files must each be named", ErrMaterial)
		}
	}
	o.Want = NodeIdentity(id)
	src, err := NewSource(files, o)
	if err != nil {
		if m.Dir != "" {
			return nil, nil, fmt.Errorf("certificates in %s: %w", m.Dir, err)
		}
		return nil, nil, fmt.Errorf("certificates: %w", err)
	}
	keys, err := LoadGossipKeys(gossip)
	if err != nil {
		return nil, nil, err
	}
	return src, keys, nil
}

// NodeCert and ClientCert name certificates for Ensure to make.
type (
	NodeCert struct {
		ID    string
		Hosts []string
	}
	ClientCert struct {
		Name string
		Role Role
	}
)

// Ensure makes what is missing in dir of a CA (with its gossip key) and the
// nodes' and clients' certificates, and keeps what exists: a step that can
// run before every start of a cluster. made, if set, is told of each thing
// it made.
func Ensure(dir string, nodes []NodeCert, clients []ClientCert, made func(string)) error {
	if dir == "" {
		return fmt.Errorf("%w: no certs directory", ErrMaterial)
	}
	if made == nil {
		made = func(string) {}
	}
	exists := func(f string) bool { _, err := os.Stat(f); return err == nil }
	if !exists(filepath.Join(dir, CACertFile)) {
		if _, err := CreateCA(dir, "raftps CA", Options{}); err != nil {
			return err
		}
		made(fmt.Sprintf("a CA and gossip key in %s", dir))
	}
	for _, n := range nodes {
		if exists(NodeFiles(dir, n.ID).Cert) {
			continue
		}
		if _, err := CreateNode(dir, n.ID, n.Hosts, Options{}); err != nil {
			return err
		}
		made(fmt.Sprintf("node %s's certificate for %s", n.ID, strings.Join(n.Hosts, ",")))
	}
	for _, c := range clients {
		if exists(ClientFiles(dir, c.Name).Cert) {
			continue
		}
		if _, err := CreateClient(dir, c.Name, c.Role, Options{}); err != nil {
			return err
		}
		made(fmt.Sprintf("client %s's certificate (%v)", c.Name, c.Role))
	}
	return nil
}
