package main

import (
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"time"

	"github.com/raftps/raftps/test/localcluster"
)

func runCluster(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" {
		fmt.Fprintln(stderr, "usage: raftps cluster up|add|down|kill NODE|restart NODE --dir D  (raftps cluster SUBCOMMAND -h lists its flags)")
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	switch args[0] {
	case "up":
		return clusterUp(args[1:], stdout, stderr)
	case "add":
		return clusterAdd(args[1:], stdout, stderr)
	case "down":
		return clusterDown(args[1:], stdout, stderr)
	case "kill", "restart":
		return clusterNode(args[0], args[1:], stdout, stderr)
	}
	fmt.Fprintf(stderr, "raftps cluster: unknown subcommand %q (want up, add, down, kill or restart)\n", args[0])
	return 2
}

func clusterUp(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("raftps cluster up", flag.ContinueOnError)
	n := fs.Int("nodes", 3, "number of nodes")
	dir := fs.String("dir", "", "directory for the cluster's data, pids and logs (required)")
	host := fs.String("host", "127.0.0.1", "address to listen on")
	base := fs.Int("base-port", 7001, "client port of the first node; node K uses base+K-1, its HTTP port base+100+K-1, its gossip port base+1000+K-1, its peer port base+2000+K-1")
	wait := fs.Duration("wait", 30*time.Second, "how long to wait for the cluster to serve")
	extra := fs.String("server-args", "", "extra arguments for every server, space-separated (e.g. \"--heartbeat-timeout 300ms\"); \"--insecure\" runs the cluster without certificates")
	caDir := fs.String("ca-dir", "", "sign the cluster's certificates with the CA in this directory (ca.crt, ca.key, gossip.key) instead of a new one in DIR/certs: clusters of one CA share their clients' credentials")
	if rc := parse(fs, args, stderr); rc >= 0 {
		return rc
	}
	if *dir == "" || *n < 1 {
		return fail(stderr, "cluster up", fmt.Errorf("--dir is required and --nodes must be at least 1"))
	}
	c, err := localcluster.Up(localcluster.UpConfig{Dir: *dir, Nodes: *n, Host: *host, BasePort: *base,
		ServerArgs: strings.Fields(*extra), CADir: *caDir, Wait: *wait, Progress: stderr})
	if err != nil {
		return fail(stderr, "cluster up", err)
	}
	addrs := strings.Join(c.Addrs(), ",")
	fmt.Fprintf(stdout, "cluster of %d nodes serving at %s\n", len(c.Nodes), addrs)
	fmt.Fprintf(stdout, "  . %s\n  raftps status\n  raftps cluster down --dir %s\n", filepath.Join(*dir, "env"), *dir)
	return 0
}

// clusterAdd starts one more node that joins the running cluster (an
// elastic cluster: the scheduler moves replicas onto it).
func clusterAdd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("raftps cluster add", flag.ContinueOnError)
	dir := fs.String("dir", "", "the cluster's directory (required)")
	wait := fs.Duration("wait", 30*time.Second, "how long to wait for the new node to serve and register")
	extra := fs.String("server-args", "", "extra arguments for the new server, space-separated (default: those 'cluster up' was given)")
	if rc := parse(fs, args, stderr); rc >= 0 {
		return rc
	}
	c, err := loadCluster(*dir)
	if err != nil {
		return fail(stderr, "cluster add", err)
	}
	var serverArgs []string
	if *extra != "" {
		serverArgs = strings.Fields(*extra)
	}
	nd, err := c.Add(serverArgs, *wait, stderr)
	if err != nil {
		return fail(stderr, "cluster add", err)
	}
	fmt.Fprintf(stdout, "%s joined the cluster at %s; replicas move onto it at the scheduler's pace ('raftps status')\n", nd.ID, nd.Addr)
	fmt.Fprintf(stdout, "  export RAFTPS_CLUSTER=%s\n", strings.Join(c.Addrs(), ","))
	return 0
}

func clusterDown(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("raftps cluster down", flag.ContinueOnError)
	dir := fs.String("dir", "", "the cluster's directory (required)")
	if rc := parse(fs, args, stderr); rc >= 0 {
		return rc
	}
	c, err := loadCluster(*dir)
	if err != nil {
		return fail(stderr, "cluster down", err)
	}
	c.StopAll(stderr)
	fmt.Fprintf(stdout, "cluster in %s stopped (data kept; remove the directory to discard it)\n", *dir)
	return 0
}

func clusterNode(verb string, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("raftps cluster "+verb+" NODE", flag.ContinueOnError)
	dir := fs.String("dir", "", "the cluster's directory (required)")
	wait := fs.Duration("wait", 30*time.Second, "restart: how long to wait for the cluster to serve")
	id, rest, rc := nameArg(fs, args, "raftps cluster "+verb+" NODE --dir D", stderr)
	if rc >= 0 {
		return rc
	}
	if rc := parse(fs, rest, stderr); rc >= 0 {
		return rc
	}
	c, err := loadCluster(*dir)
	if err == nil {
		_, err = c.Node(id)
	}
	if err != nil {
		return fail(stderr, "cluster "+verb, err)
	}
	if verb == "kill" {
		if err := c.Kill(id); err != nil {
			return fail(stderr, "cluster kill", err)
		}
		fmt.Fprintf(stdout, "killed %s\n", id)
		return 0
	}
	if err := c.Restart(id, *wait, stderr); err != nil {
		return fail(stderr, "cluster restart", fmt.Errorf("%w (log: %s)", err, filepath.Join(*dir, id, "log")))
	}
	fmt.Fprintf(stdout, "restarted %s\n", id)
	return 0
}

// loadCluster loads the local cluster of --dir.
func loadCluster(dir string) (*localcluster.Cluster, error) {
	if dir == "" {
		return nil, fmt.Errorf("--dir is required")
	}
	return localcluster.Load(dir)
}
