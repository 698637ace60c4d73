package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/raftps/raftps/shard/certs"
)

const certUsage = `usage: raftps cert create-ca|create-node|create-client|init|list --certs-dir D [flags]
  create-ca      a new CA (ca.crt, ca.key) and gossip key (gossip.key)
  create-node    node.ID.crt/.key: --id n1 --host 10.0.0.1,n1.example
  create-client  client.NAME.crt/.key: --name trainer --role reader|writer|admin
  init           what is missing of a CA, nodes and clients (idempotent): --node n1=HOST,HOST --client admin=admin
  list           every certificate in D: identity, role, hosts, expiry, problems`

// runCert makes and lists certificate material; the work is package
// shard/certs's.
func runCert(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, certUsage)
		return 2
	}
	verb := args[0]
	fs := flag.NewFlagSet("raftps cert "+verb, flag.ContinueOnError)
	dir := fs.String("certs-dir", os.Getenv("RAFTPS_CERTS_DIR"), "the certificates directory (default $RAFTPS_CERTS_DIR)")
	var opts certs.Options
	var caName, id, hosts, name, role string
	var asJSON bool
	if verb != "list" {
		fs.DurationVar(&opts.Lifetime, "lifetime", 0, fmt.Sprintf("how long the certificate is valid (default: CA %v, node %v, client %v; never past the CA's expiry)",
			certs.DefaultCALifetime, certs.DefaultNodeLifetime, certs.DefaultClientLifetime))
		fs.BoolVar(&opts.Overwrite, "overwrite", false, "replace existing files (by default they are kept and the command fails)")
	}
	switch verb {
	case "create-ca":
		fs.StringVar(&caName, "name", "raftps CA", "the CA's name (its certificate's CN)")
	case "create-node":
		fs.StringVar(&id, "id", "", "the node's ID, as its server --id (required)")
		fs.StringVar(&hosts, "host", "", "comma-separated DNS names and IP addresses clients and peers dial the node by: the hosts of its --addr and --peer-addr (required)")
	case "create-client":
		fs.StringVar(&name, "name", "", "the client's name (required)")
		fs.StringVar(&role, "role", "", "reader (pull, describe, status), writer (+ push, jobs) or admin (+ tables, nodes, job deletion) (required)")
	case "list":
		fs.BoolVar(&asJSON, "json", false, "print JSON on stdout")
	case "init":
		return certInit(fs, args[1:], dir, stdout, stderr)
	case "-h", "--help", "help":
		fmt.Fprintln(stdout, certUsage)
		return 0
	default:
		fmt.Fprintf(stderr, "raftps cert: unknown subcommand %q (want create-ca, create-node, create-client, init or list)\n", verb)
		return 2
	}
	if rc := parse(fs, args[1:], stderr); rc >= 0 {
		return rc
	}
	cmd := "cert " + verb
	if fs.NArg() != 0 {
		return fail(stderr, cmd, fmt.Errorf("unexpected arguments %q (every value is a flag)", fs.Args()))
	}
	if *dir == "" {
		return fail(stderr, cmd, errors.New("--certs-dir is required (or set RAFTPS_CERTS_DIR)"))
	}
	var is *certs.Issued
	var err error
	switch verb {
	case "create-ca":
		var ca *certs.Authority
		if ca, err = certs.CreateCA(*dir, caName, opts); err == nil {
			fmt.Fprintf(stdout, "wrote %s/{%s,%s,%s}: CA %q, expires %s\n", *dir, certs.CACertFile, certs.CAKeyFile, certs.GossipKeyFile,
				ca.Cert.Subject.CommonName, ca.Cert.NotAfter.Format(time.DateOnly))
			fmt.Fprintf(stdout, "give every node and client %s; keep %s where only certificates are made\n", certs.CACertFile, certs.CAKeyFile)
		}
	case "create-node":
		switch {
		case id == "":
			err = errors.New("--id is required")
		case strings.TrimSpace(hosts) == "":
			err = errors.New("--host is required: the names and addresses the node is dialed by")
		default:
			is, err = certs.CreateNode(*dir, id, strings.Split(hosts, ","), opts)
		}
	case "create-client":
		var r certs.Role
		switch {
		case name == "":
			err = errors.New("--name is required")
		case role == "":
			err = errors.New("--role is required: reader, writer or admin")
		default:
			if r, err = certs.ParseRole(role); err == nil {
				is, err = certs.CreateClient(*dir, name, r, opts)
			}
		}
	case "list":
		err = listCerts(*dir, asJSON, stdout)
	}
	if err != nil {
		return fail(stderr, cmd, err)
	}
	if is != nil {
		id, _ := certs.IdentityOf(is.Cert)
		fmt.Fprintf(stdout, "wrote %v's certificate and key to %s, expires %s\n", id, *dir, is.Cert.NotAfter.Format(time.DateOnly))
	}
	return 0
}

func listCerts(dir string, asJSON bool, stdout io.Writer) error {
	es, err := certs.List(dir, time.Now())
	if err != nil {
		return err
	}
	if asJSON {
		return printJSON(stdout, es)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "FILE\tKIND\tNAME\tROLE\tHOSTS\tEXPIRES\tPROBLEM")
	for _, e := range es {
		kind, name, role := "-", "-", "-"
		if e.CA {
			kind = "ca"
		}
		if !e.CA && e.Identity.Kind != 0 {
			kind, name = e.Identity.Kind.String(), e.Identity.Name
			if e.Identity.Kind == certs.KindClient {
				role = e.Identity.Role.String()
			}
		}
		hosts := strings.Join(e.Hosts, ",")
		if hosts == "" {
			hosts = "-"
		}
		problem := e.Problem
		if problem == "" {
			problem = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", e.File, kind, name, role, hosts, e.NotAfter.Format(time.DateOnly), problem)
	}
	return tw.Flush()
}
