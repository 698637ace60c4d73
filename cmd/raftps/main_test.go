package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestRun(t *testing.T) {
	for _, tc := range []struct {
		args       []string
		code       int
		out, errSu string
	}{
		{nil, 0, "Commands:", ""},
		{[]string{"help"}, 0, "version", ""},
		{[]string{"version"}, 0, "raftps ", ""},
		{[]string{"version", "x"}, 2, "", "takes no arguments"},
		{[]string{"frobnicate"}, 2, "", `unknown command "frobnicate"`},
		{[]string{"help"}, 0, "node", ""},
		{[]string{"node"}, 2, "", "usage: raftps node drain|remove|activate NODE"},
		{[]string{"node", "frob", "n1"}, 2, "", `unknown subcommand "frob"`},
		{[]string{"node", "drain"}, 2, "", "usage: raftps node drain NODE"},
		{[]string{"node", "remove", "n1", "--cluster", ""}, 1, "", "no cluster given"},
		{[]string{"node", "remove", "n1", "--wait"}, 2, "", "flag provided but not defined: -wait"},
		{[]string{"cluster", "add"}, 1, "", "--dir is required"},
		{[]string{"server", "--id", "n1", "--addr", "127.0.0.1:0", "--data-dir", "DIR", "--bootstrap", "--join", "127.0.0.1:1"}, 1, "", "give one of --peers, --bootstrap and --join"},
		// Secure by default: no certificates, no server; and no client
		// without credentials.
		{[]string{"server", "--id", "n1", "--addr", "127.0.0.1:0", "--data-dir", "DIR", "--bootstrap", "--certs-dir", ""}, 1, "", "no certificates: give --certs-dir"},
		{[]string{"server", "--id", "n1", "--addr", "127.0.0.1:0", "--data-dir", "DIR", "--bootstrap", "--certs-dir", "/nonexistent", "--insecure"}, 1, "", "--insecure with certificates"},
		{[]string{"server", "--id", "n1", "--addr", "127.0.0.1:0", "--data-dir", "DIR", "--bootstrap", "--certs-dir", "/nonexistent"}, 1, "", "certificates in /nonexistent"},
		{[]string{"status", "--cluster", "127.0.0.1:1", "--ca", "", "--insecure=false"}, 1, "", "no CA: the cluster's CA certificate file is needed: give --ca"},
		{[]string{"status", "--cluster", "127.0.0.1:1", "--ca", "x.crt", "--cert", "c.crt", "--key", "", "--insecure=false"}, 1, "", "a certificate file and a key file go together"},
		{[]string{"table", "frob"}, 2, "", "want create, alter, drop, list or describe"},
		{[]string{"table", "alter"}, 2, "", "usage: raftps table alter NAME"},
		{[]string{"table", "alter", "t", "--cluster", ""}, 1, "", "nothing to change"},
		{[]string{"table", "alter", "t", "--consistency", "bounded:soon", "--cluster", ""}, 1, "", "is not a positive duration"},
		{[]string{"table", "alter", "t", "--hot-threshold", "5", "--hot-replicas", "17", "--cluster", "127.0.0.1:1", "--insecure"}, 1, "", "17 hot-key read replicas: want 0..16"},
		{[]string{"table", "alter", "t", "--hot-threshold", "0", "--cluster", ""}, 1, "", "no cluster given"},
		{[]string{"table", "create", "t", "--dim", "4", "--hot-threshold", "-1", "--cluster", "127.0.0.1:1", "--insecure"}, 1, "", "hot-key threshold -1: want pulls a second >= 0"},
		{[]string{"table", "create", "t", "--dim", "4", "--hot-replicas", "3", "--cluster", "127.0.0.1:1", "--insecure"}, 1, "", "without a threshold"},
		{[]string{"table", "create", "t", "--dim", "4", "--replication", "paxos"}, 1, "", "--replication \"paxos\": want raft or chain"},
		// Chain tables take hot keys: refused only for want of a cluster.
		{[]string{"table", "create", "t", "--dim", "4", "--replication", "chain", "--hot-threshold", "10", "--cluster", ""}, 1, "", "no cluster given"},
		// Bounded tables are no longer refused before the cluster is asked.
		{[]string{"table", "create", "t", "--dim", "4", "--consistency", "bounded:100ms", "--hot-threshold", "1000", "--cluster", ""}, 1, "", "no cluster given"},
		{[]string{"pull", "t", "1", "--consistency", "bounded", "--cluster", ""}, 1, "", "bounded needs its bound"},
		{[]string{"pull", "t", "--cluster", ""}, 1, "", "no keys"},
		// Every subcommand's -h lists its flags, those that take a name
		// first included.
		{[]string{"pull", "-h"}, 0, "", "-consistency"},
		{[]string{"table", "create", "-h"}, 0, "", "-dim"},
		{[]string{"table", "alter", "-h"}, 0, "", "-hot-threshold"},
		{[]string{"table", "describe", "-h"}, 0, "", "-cluster"},
		{[]string{"node", "drain", "-h"}, 0, "", "-wait"},
		{[]string{"cluster", "kill", "-h"}, 0, "", "-dir"},
		{[]string{"cluster", "up", "-h"}, 0, "", "-base-port"},
		{[]string{"server", "-h"}, 0, "", "-peer-addr"},
		{[]string{"chaos", "-h"}, 0, "", "-faults"},
		{[]string{"bench", "-h"}, 0, "", "-workload"},
		{[]string{"status", "-h"}, 0, "", "-checksums"},
		{[]string{"pull", "t", "1", "--consistency", "eventual", "--allow-weaker", "--cluster", ""}, 1, "", "no cluster given"},
		{[]string{"status", "--hot", "--cluster", ""}, 1, "", "no cluster given"},
	} {
		var out, errb bytes.Buffer
		if code := run(tc.args, &out, &errb); code != tc.code {
			t.Errorf("%v: exit %d, want %d", tc.args, code, tc.code)
		}
		if !strings.Contains(out.String(), tc.out) || !strings.Contains(errb.String(), tc.errSu) {
			t.Errorf("%v: stdout %q stderr %q", tc.args, out.String(), errb.String())
		}
	}
}
