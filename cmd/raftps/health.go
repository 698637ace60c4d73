package main

import (
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/raftps/raftps/test/localcluster"
)

// healthTimeout bounds the whole request: a container healthcheck must not
// hang on a node that accepts connections but does not answer.
const healthTimeout = 2 * time.Second

// runHealth GETs a node's /healthz and turns the answer into an exit status.
// It exists for container healthchecks: a FROM scratch image has no shell,
// curl or wget, only this binary.
func runHealth(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("raftps health", flag.ContinueOnError)
	addr := fs.String("http", "127.0.0.1:7101", "the node's HTTP address (its server --http)")
	if rc := parse(fs, args, stderr); rc >= 0 {
		return rc
	}
	if fs.NArg() != 0 {
		fmt.Fprintln(stderr, "raftps health: takes no arguments (usage: raftps health [--http ADDR])")
		return 2
	}
	if err := localcluster.CheckHealth(*addr, healthTimeout); err != nil {
		return fail(stderr, "health", err)
	}
	fmt.Fprintf(stdout, "%s: ok\n", *addr)
	return 0
}
