package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/raftps/raftps/shard/client"
)

// tokenUsage is the token command's synopsis.
const tokenUsage = `usage: raftps token create|list|revoke [flags]
  create --name N --role reader|writer|admin   make a bearer token; printed once, the cluster keeps its hash
  list                                         the tokens' IDs, names and roles (never their secrets)
  revoke ID|NAME                               delete a token: every node refuses it from then on`

func runToken(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, tokenUsage)
		return 2
	}
	verb, args := args[0], args[1:]
	fs := flag.NewFlagSet("raftps token "+verb, flag.ContinueOnError)
	var cf clusterFlags
	cf.register(fs)
	timeout := fs.Duration("timeout", 10*time.Second, "how long to keep trying to reach the metadata leader")
	var name, role *string
	var idOrName string
	switch verb {
	case "create":
		name = fs.String("name", "", "the token's name (unique in the cluster): who or what uses it")
		role = fs.String("role", "", "reader (pull, describe, status), writer (+ push, jobs) or admin (+ tables, nodes, tokens)")
	case "list":
	case "revoke":
		var rc int
		if idOrName, args, rc = nameArg(fs, args, "raftps token revoke ID|NAME [flags]", stderr); rc >= 0 {
			return rc
		}
	case "-h", "--help", "help":
		fmt.Fprintln(stdout, tokenUsage)
		return 0
	default:
		fmt.Fprintf(stderr, "raftps token: unknown subcommand %q (want create, list or revoke)\n", verb)
		return 2
	}
	if rc := parse(fs, args, stderr); rc >= 0 {
		return rc
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "raftps token %s: unexpected arguments %q\n", verb, fs.Args())
		return 2
	}
	if verb == "create" && (*name == "" || *role == "") {
		fmt.Fprintln(stderr, "raftps token create: --name and --role are required")
		return 2
	}
	cmd := "token " + verb
	cl, err := cf.client()
	if err != nil {
		return fail(stderr, cmd, err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	switch verb {
	case "create":
		tok, info, pending, err := cl.Admin().CreateToken(ctx, *name, *role)
		if err != nil {
			return fail(stderr, cmd, err)
		}
		if cf.json {
			err = printJSON(stdout, struct {
				Token   string   `json:"token"`
				Info    any      `json:"info"`
				Pending []string `json:"pending,omitempty"`
			}{tok, info, pending})
			return failIf(stderr, cmd, err)
		}
		// The token alone on stdout, for scripts; the rest on stderr.
		fmt.Fprintln(stdout, tok)
		fmt.Fprintf(stderr, "token %s (%s, %s) created; it is shown only this once: pass it with --token or RAFTPS_TOKEN\n", info.ID, info.Name, info.Role)
		warnPending(stderr, "accept", pending)
	case "list":
		toks, err := cl.Admin().Tokens(ctx)
		if err != nil {
			return fail(stderr, cmd, err)
		}
		if cf.json {
			return failIf(stderr, cmd, printJSON(stdout, toks))
		}
		printTokens(stdout, toks)
	case "revoke":
		t, pending, err := cl.Admin().RevokeToken(ctx, idOrName)
		if err != nil {
			return fail(stderr, cmd, err)
		}
		if cf.json {
			return failIf(stderr, cmd, printJSON(stdout, struct {
				Revoked client.Token `json:"revoked"`
				Pending []string     `json:"pending,omitempty"`
			}{t, pending}))
		}
		fmt.Fprintf(stdout, "token %s (%s, %s) revoked\n", t.ID, t.Name, t.Role)
		warnPending(stderr, "refuse", pending)
	}
	return 0
}

// warnPending names the nodes that had not applied a token change.
func warnPending(stderr io.Writer, verb string, pending []string) {
	if len(pending) > 0 {
		fmt.Fprintf(stderr, "nodes %s had not applied the change when the cluster answered (down or behind): they %s the token once they catch up\n", strings.Join(pending, ", "), verb)
	}
}

func printTokens(w io.Writer, toks []client.Token) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tNAME\tROLE")
	for _, t := range toks {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", t.ID, t.Name, t.Role)
	}
	tw.Flush()
}

// failIf is fail for a non-nil err, else 0.
func failIf(stderr io.Writer, cmd string, err error) int {
	if err != nil {
		return fail(stderr, cmd, err)
	}
	return 0
}
