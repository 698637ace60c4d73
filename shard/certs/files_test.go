package certs_test

import (
	"bytes"
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/raftps/raftps/shard/certs"
	"github.com/raftps/raftps/shard/certs/certstest"
)

func mode(t *testing.T, path string) os.FileMode {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return st.Mode().Perm()
}

// TestCreateFiles: the CA, a node and a client are written with keys 0600,
// certificates 0644 and the directory 0700; nothing is overwritten without
// Overwrite (and a refused CreateCA leaves the old files as they were); a
// node's certificate carries its ID and hosts and outlives nothing.
func TestCreateFiles(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	if _, err := certs.CreateNode(dir, "n1", []string{"127.0.0.1"}, certs.Options{}); !errors.Is(err, certs.ErrNoCA) {
		t.Fatalf("node without a CA: %v, want ErrNoCA", err)
	}
	ca, err := certs.CreateCA(dir, "test", certs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if m := mode(t, dir); m != 0o700 {
		t.Errorf("certs dir mode %v, want 0700", m)
	}
	for name, want := range map[string]os.FileMode{certs.CACertFile: 0o644, certs.CAKeyFile: 0o600, certs.GossipKeyFile: 0o600} {
		if m := mode(t, filepath.Join(dir, name)); m != want {
			t.Errorf("%s mode %v, want %v", name, m, want)
		}
	}
	before, _ := os.ReadFile(filepath.Join(dir, certs.CAKeyFile))
	if _, err := certs.CreateCA(dir, "test", certs.Options{}); !errors.Is(err, certs.ErrExists) || !strings.Contains(err.Error(), "--overwrite") {
		t.Errorf("second CA: %v, want ErrExists naming --overwrite", err)
	}
	if after, _ := os.ReadFile(filepath.Join(dir, certs.CAKeyFile)); !bytes.Equal(before, after) {
		t.Error("a refused CreateCA changed ca.key")
	}
	gk, err := certs.LoadGossipKeys(filepath.Join(dir, certs.GossipKeyFile))
	if err != nil || len(gk) != 1 || len(gk[0]) != certs.GossipKeyBytes {
		t.Fatalf("gossip key: %d keys, %v", len(gk), err)
	}

	is, err := certs.CreateNode(dir, "n1", []string{"127.0.0.1", "node1.example", "::1"}, certs.Options{Validity: certs.Validity{Lifetime: 100 * 365 * 24 * time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	f := certs.NodeFiles(dir, "n1")
	if mode(t, f.Key) != 0o600 || mode(t, f.Cert) != 0o644 {
		t.Errorf("node files modes %v %v", mode(t, f.Cert), mode(t, f.Key))
	}
	if id, _ := certs.IdentityOf(is.Cert); id != certs.NodeIdentity("n1") || is.Cert.Subject.CommonName != "n1" {
		t.Errorf("node certificate: %v, CN %q", id, is.Cert.Subject.CommonName)
	}
	if len(is.Cert.IPAddresses) != 2 || len(is.Cert.DNSNames) != 1 || is.Cert.DNSNames[0] != "node1.example" {
		t.Errorf("hosts: IPs %v, names %v", is.Cert.IPAddresses, is.Cert.DNSNames)
	}
	if !is.Cert.NotAfter.Equal(ca.Cert.NotAfter) {
		t.Errorf("a 100-year node certificate expires %v, not with its CA (%v)", is.Cert.NotAfter, ca.Cert.NotAfter)
	}
	if _, err := certs.CreateNode(dir, "n1", []string{"127.0.0.1"}, certs.Options{}); !errors.Is(err, certs.ErrExists) {
		t.Errorf("node n1 again: %v, want ErrExists", err)
	}
	if _, err := certs.CreateNode(dir, "n1", []string{"127.0.0.2"}, certs.Options{Overwrite: true}); err != nil {
		t.Errorf("node n1 again with Overwrite: %v", err)
	}
	if _, err := certs.CreateClient(dir, "trainer", certs.RoleWriter, certs.Options{}); err != nil {
		t.Fatal(err)
	}

	for what, err := range map[string]error{
		"no hosts": func() error { _, err := certs.CreateNode(dir, "n2", nil, certs.Options{}); return err }(),
		"host:port": func() error {
			_, err := certs.CreateNode(dir, "n2", []string{"10.0.0.1:7001"}, certs.Options{})
			return err
		}(),
		"wildcard": func() error {
			_, err := certs.CreateNode(dir, "n2", []string{"*.example"}, certs.Options{})
			return err
		}(),
		"bad ID":   func() error { _, err := certs.CreateNode(dir, "n/2", []string{"h"}, certs.Options{}); return err }(),
		"no role":  func() error { _, err := certs.CreateClient(dir, "x", certs.RoleNone, certs.Options{}); return err }(),
		"bad name": func() error { _, err := certs.CreateClient(dir, "", certs.RoleAdmin, certs.Options{}); return err }(),
		"negative": func() error {
			_, err := certs.CreateClient(dir, "y", certs.RoleAdmin, certs.Options{Validity: certs.Validity{Lifetime: -1}})
			return err
		}(),
		"unnamed CA":  func() error { _, err := certs.NewAuthority(" ", certs.Validity{}); return err }(),
		"CA with key": func() error { _, err := certs.ParseAuthority(ca.CertPEM(), is.KeyPEM); return err }(),
	} {
		if err == nil {
			t.Errorf("%s: accepted", what)
		} else if !errors.Is(err, certs.ErrInvalid) && !errors.Is(err, certs.ErrMaterial) {
			t.Errorf("%s: %v, want ErrInvalid or ErrMaterial", what, err)
		}
	}
	if _, err := os.Stat(certs.NodeFiles(dir, "n2").Cert); err == nil {
		t.Error("a refused node certificate was written")
	}
}

// TestGossipKeys: a key file holds one key a line, the first the one
// to send with; a short key, text that is not base64 and an empty file are
// refused naming the line.
func TestGossipKeys(t *testing.T) {
	dir := t.TempDir()
	k1, _ := certs.NewGossipKey()
	k2, _ := certs.NewGossipKey()
	enc := base64.StdEncoding.EncodeToString
	for _, tc := range []struct {
		text string
		keys [][]byte
		err  string
	}{
		{enc(k1) + "\n", [][]byte{k1}, ""},
		{enc(k2) + "\n\n  " + enc(k1) + "  \n", [][]byte{k2, k1}, ""},
		{enc(k1[:16]) + "\n", nil, "line 1: 16 bytes, want 32"},
		{enc(k1) + "\nnot base64!\n", nil, "line 2: not base64"},
		{"\n", nil, "no key"},
	} {
		p := filepath.Join(dir, "gossip.key")
		if err := os.WriteFile(p, []byte(tc.text), 0o600); err != nil {
			t.Fatal(err)
		}
		keys, err := certs.LoadGossipKeys(p)
		if tc.err != "" {
			if !errors.Is(err, certs.ErrMaterial) || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: %v, want ErrMaterial saying %q", tc.text, err, tc.err)
			}
			continue
		}
		if err != nil || len(keys) != len(tc.keys) {
			t.Fatalf("%q: %d keys, %v", tc.text, len(keys), err)
		}
		for i := range keys {
			if !bytes.Equal(keys[i], tc.keys[i]) {
				t.Errorf("%q: key %d differs", tc.text, i)
			}
		}
	}
}

// TestList: every certificate is described, the CA first, and each one
// that would be refused says why.
func TestList(t *testing.T) {
	d := certstest.New(t)
	d.Node("n1")
	d.Client("ops", certs.RoleAdmin)
	d.NodeValid("old", certstest.Expired())
	other := certstest.New(t)
	of := other.Node("n9")
	for _, p := range [][2]string{{of.Cert, filepath.Join(d.Path, "node.n9.crt")}, {of.Key, filepath.Join(d.Path, "node.n9.key")}} {
		b, _ := os.ReadFile(p[0])
		if err := os.WriteFile(p[1], b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	es, err := certs.List(d.Path, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]certs.Entry{}
	for _, e := range es {
		got[e.File] = e
	}
	if len(es) != 5 || !es[0].CA || es[0].File != certs.CACertFile {
		t.Fatalf("entries %+v: want 5, ca.crt first", es)
	}
	for file, want := range map[string]string{"node.n1.crt": "", "client.ops.crt": "", "node.old.crt": "expired", "node.n9.crt": "not signed by ca.crt; key node.n9.key readable by others (mode -rw-r--r--)"} {
		if e := got[file]; e.Problem != want {
			t.Errorf("%s: problem %q, want %q", file, e.Problem, want)
		}
	}
	if e := got["client.ops.crt"]; e.Identity != certs.ClientIdentity("ops", certs.RoleAdmin) {
		t.Errorf("client.ops.crt: identity %v", e.Identity)
	}
	if _, err := certs.List(t.TempDir(), time.Now()); err == nil {
		t.Error("List of an empty directory: no error")
	}
}

// TestNodeMaterialLoad: a node opens its own material from a certs
// directory, a file named by itself wins over the directory's, another
// node's certificate is refused, and without a directory every file must
// be named.
func TestNodeMaterialLoad(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	if _, err := certs.CreateCA(dir, "test", certs.Options{}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"n1", "n2"} {
		if _, err := certs.CreateNode(dir, id, []string{"127.0.0.1"}, certs.Options{}); err != nil {
			t.Fatal(err)
		}
	}
	src, keys, err := certs.NodeMaterial{Dir: dir}.Load("n1", certs.SourceOptions{})
	if err != nil || src == nil || len(keys) != 1 {
		t.Fatalf("n1 from its directory: %v, %d gossip keys", err, len(keys))
	}
	n2 := certs.NodeFiles(dir, "n2")
	if _, _, err := (certs.NodeMaterial{Dir: dir, Cert: n2.Cert, Key: n2.Key}).Load("n1", certs.SourceOptions{}); err == nil {
		t.Error("n2's certificate opened as n1's")
	}
	n1 := certs.NodeFiles(dir, "n1")
	if _, _, err := (certs.NodeMaterial{CA: n1.CA, Cert: n1.Cert, Key: n1.Key}).Load("n1", certs.SourceOptions{}); !errors.Is(err, certs.ErrMaterial) {
		t.Errorf("no directory and no gossip key file: %v, want ErrMaterial", err)
	}
	all := certs.NodeMaterial{CA: n1.CA, Cert: n1.Cert, Key: n1.Key, GossipKey: filepath.Join(dir, certs.GossipKeyFile)}
	if _, _, err := all.Load("n1", certs.SourceOptions{}); err != nil {
		t.Errorf("every file named: %v", err)
	}
}
