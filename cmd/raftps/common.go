package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/raftps/raftps/shard/client"
)

// clusterFlags are the flags every client command takes.
type clusterFlags struct {
	cluster string
	json    bool
	tls     clientTLSFlags
	// metrics, if set, gets the client's metrics (--metrics-addr).
	metrics prometheus.Registerer
}

func (c *clusterFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&c.cluster, "cluster", os.Getenv("RAFTPS_CLUSTER"), "comma-separated gRPC addresses of cluster nodes (default $RAFTPS_CLUSTER)")
	fs.BoolVar(&c.json, "json", false, "print JSON on stdout")
	c.tls.register(fs)
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

func (c *clusterFlags) client() (*client.Client, error) {
	if len(c.addrs()) == 0 {
		return nil, fmt.Errorf("no cluster given: pass --cluster ADDR[,ADDR...] or set RAFTPS_CLUSTER")
	}
	cfg, err := c.config()
	if err != nil {
		return nil, err
	}
	return client.New(cfg)
}

// config is the client configuration of the flags: the addresses and the
// credentials.
func (c *clusterFlags) config() (client.Config, error) {
	cfg := client.DefaultConfig(c.addrs()...)
	cfg.Metrics = c.metrics
	opts, err := c.tls.dialOptions()
	if err != nil {
		return cfg, err
	}
	cfg.DialOptions = append(cfg.DialOptions, opts...)
	return cfg, nil
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

// nameArg takes the positional argument a subcommand's usage starts with
// (a table's name, a node's ID) from args, and returns it with the rest.
// Without one it prints the usage and every flag, and returns the exit
// status: 0 for -h, 2 otherwise; rc is -1 when the command goes on.
func nameArg(fs *flag.FlagSet, args []string, usage string, stderr io.Writer) (name string, rest []string, rc int) {
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		return args[0], args[1:], -1
	}
	fmt.Fprintf(stderr, "usage: %s\n", usage)
	fs.SetOutput(stderr)
	fs.PrintDefaults()
	if len(args) > 0 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help") {
		return "", nil, 0
	}
	return "", nil, 2
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
