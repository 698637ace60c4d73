package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/raftps/raftps/shard"
)

// clusterFlags are the flags every client command takes.
type clusterFlags struct {
	cluster string
	json    bool
}

func (c *clusterFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&c.cluster, "cluster", os.Getenv("RAFTPS_CLUSTER"), "comma-separated gRPC addresses of cluster nodes (default $RAFTPS_CLUSTER)")
	fs.BoolVar(&c.json, "json", false, "print JSON on stdout")
}

func (c *clusterFlags) addrs() []string {
	var out []string
	for _, a := range strings.Split(c.cluster, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	return out
}

func (c *clusterFlags) client() (*shard.Client, error) {
	if len(c.addrs()) == 0 {
		return nil, fmt.Errorf("no cluster given: pass --cluster ADDR[,ADDR...] or set RAFTPS_CLUSTER")
	}
	return shard.NewClient(shard.ClientConfig{Addrs: c.addrs()})
}

// parse parses args; it returns the exit status to use if parsing ended the
// command (help or a bad flag), or -1 to go on.
func parse(fs *flag.FlagSet, args []string, stderr io.Writer) int {
	fs.SetOutput(stderr)
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return 0
		}
		return 2
	}
	return -1
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// fail prints err for the command and returns exit status 1.
func fail(stderr io.Writer, cmd string, err error) int {
	fmt.Fprintf(stderr, "raftps %s: %v\n", cmd, err)
	return 1
}
