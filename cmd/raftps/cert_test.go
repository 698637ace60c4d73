package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCertCommand: the cert subcommands make a CA, a node and a client,
// refuse to overwrite, missing flags, a bad role and a directory without
// a CA with a message saying so, and list what they made.
func TestCertCommand(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	t.Setenv("RAFTPS_CERTS_DIR", "")
	for _, tc := range []struct {
		args     []string
		code     int
		out, err string
	}{
		{[]string{"cert"}, 2, "", "usage: raftps cert create-ca|create-node|create-client|init|list"},
		{[]string{"cert", "frob"}, 2, "", `unknown subcommand "frob"`},
		{[]string{"cert", "create-node", "-h"}, 0, "", "-host"},
		{[]string{"cert", "create-client", "-h"}, 0, "", "-role"},
		{[]string{"cert", "list", "-h"}, 0, "", "-certs-dir"},
		{[]string{"cert", "create-ca"}, 1, "", "--certs-dir is required"},
		{[]string{"cert", "create-node", "--certs-dir", dir, "--id", "n1", "--host", "127.0.0.1"}, 1, "", "no certificate authority in " + dir},
		{[]string{"cert", "create-ca", "--certs-dir", dir}, 0, "wrote " + dir + "/{ca.crt,ca.key,gossip.key}", ""},
		{[]string{"cert", "create-ca", "--certs-dir", dir}, 1, "", "ca.crt: file exists (give --overwrite to replace it)"},
		{[]string{"cert", "create-node", "--certs-dir", dir, "--host", "127.0.0.1"}, 1, "", "--id is required"},
		{[]string{"cert", "create-node", "--certs-dir", dir, "--id", "n1"}, 1, "", "--host is required"},
		{[]string{"cert", "create-node", "--certs-dir", dir, "--id", "n1", "--host", "127.0.0.1:7001"}, 1, "", `host "127.0.0.1:7001": want a DNS name or an IP address, without port`},
		{[]string{"cert", "create-node", "--certs-dir", dir, "--id", "n1", "--host", "127.0.0.1,localhost"}, 0, "wrote node n1's certificate and key", ""},
		{[]string{"cert", "create-node", "--certs-dir", dir, "--id", "n1", "--host", "127.0.0.1"}, 1, "", "node.n1.crt: file exists"},
		{[]string{"cert", "create-node", "--certs-dir", dir, "--id", "n1", "--host", "127.0.0.1", "--overwrite"}, 0, "wrote node n1's", ""},
		{[]string{"cert", "create-client", "--certs-dir", dir, "--name", "trainer"}, 1, "", "--role is required"},
		{[]string{"cert", "create-client", "--certs-dir", dir, "--name", "trainer", "--role", "root"}, 1, "", `role "root": want reader, writer or admin`},
		{[]string{"cert", "create-client", "--certs-dir", dir, "--name", "trainer", "--role", "writer", "--lifetime", "-1h"}, 1, "", "lifetime -1h0m0s is negative"},
		{[]string{"cert", "create-client", "--certs-dir", dir, "--name", "trainer", "--role", "writer"}, 0, "wrote client trainer (writer)'s", ""},
		{[]string{"cert", "list", "--certs-dir", dir, "extra"}, 1, "", "unexpected arguments"},
		{[]string{"cert", "list", "--certs-dir", dir}, 0, "client.trainer.crt  client  trainer  writer", ""},
		{[]string{"cert", "list", "--certs-dir", dir, "--json"}, 0, `"role": "writer"`, ""},
	} {
		var out, errb bytes.Buffer
		code := run(tc.args, &out, &errb)
		if code != tc.code || !strings.Contains(out.String(), tc.out) || !strings.Contains(errb.String(), tc.err) {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want %d, %q, %q", tc.args, code, out.String(), errb.String(), tc.code, tc.out, tc.err)
		}
	}
}

// TestCertInit: init makes what is missing and keeps what exists, so the
// compose file's certs service may run it on every start.
func TestCertInit(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	runInit := func(args ...string) string {
		t.Helper()
		var out, errb bytes.Buffer
		if code := run(append([]string{"cert", "init", "--certs-dir", dir}, args...), &out, &errb); code != 0 {
			t.Fatalf("cert init %v: exit %d: %s", args, code, errb.String())
		}
		return out.String()
	}
	first := runInit("--node", "n1=127.0.0.1,n1", "--client", "ops=admin")
	if !strings.Contains(first, "made a CA") || !strings.Contains(first, "made node n1") || !strings.Contains(first, "made client ops") {
		t.Errorf("first init: %q", first)
	}
	ca, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	second := runInit("--node", "n1=127.0.0.1,n1", "--node", "n2=127.0.0.2", "--client", "ops=admin")
	if second != "made node n2's certificate for 127.0.0.2\n" {
		t.Errorf("second init made %q, want only n2's", second)
	}
	if again, _ := os.ReadFile(filepath.Join(dir, "ca.crt")); !bytes.Equal(again, ca) {
		t.Error("the second init replaced the CA")
	}
	var errb bytes.Buffer
	if code := run([]string{"cert", "init", "--certs-dir", dir, "--client", "ops=root"}, &bytes.Buffer{}, &errb); code != 1 || !strings.Contains(errb.String(), "want NAME=ROLE") {
		t.Errorf("a bad role: exit %d, %q", code, errb.String())
	}
}
