package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/raftps/raftps/shard/certs"
)

// listFlag is a flag that may be given many times.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, " ") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

// certInit makes what is missing of a CA and the given nodes' and clients'
// certificates, and keeps what exists: one command a container without a
// shell can run before its cluster starts, every time (the compose file's
// certs service).
func certInit(fs *flag.FlagSet, args []string, dir *string, stdout, stderr io.Writer) int {
	var nodes, clients listFlag
	fs.Var(&nodes, "node", "a node's certificate: ID=HOST[,HOST...] (repeatable)")
	fs.Var(&clients, "client", "a client's certificate: NAME=ROLE (repeatable)")
	if rc := parse(fs, args, stderr); rc >= 0 {
		return rc
	}
	if err := initCerts(*dir, nodes, clients, stdout); err != nil {
		return fail(stderr, "cert init", err)
	}
	return 0
}

func initCerts(dir string, nodes, clients []string, stdout io.Writer) error {
	if dir == "" {
		return errors.New("--certs-dir is required (or set RAFTPS_CERTS_DIR)")
	}
	var ns []certs.NodeCert
	for _, n := range nodes {
		id, hosts, ok := strings.Cut(n, "=")
		if !ok || id == "" || hosts == "" {
			return fmt.Errorf("--node %q: want ID=HOST[,HOST...]", n)
		}
		ns = append(ns, certs.NodeCert{ID: id, Hosts: strings.Split(hosts, ",")})
	}
	var cs []certs.ClientCert
	for _, c := range clients {
		name, role, ok := strings.Cut(c, "=")
		r, err := certs.ParseRole(role)
		if !ok || name == "" || err != nil {
			return fmt.Errorf("--client %q: want NAME=ROLE (reader, writer or admin)", c)
		}
		cs = append(cs, certs.ClientCert{Name: name, Role: r})
	}
	return certs.Ensure(dir, ns, cs, func(what string) { fmt.Fprintf(stdout, "made %s\n", what) })
}
