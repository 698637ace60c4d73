package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/raftps/raftps/shard"
)

// A local cluster lives in one directory. cluster up starts its first nodes
// as a static cluster (--peers); cluster add starts one more that joins it
// (--join), and records it like the others.
//
//	DIR/cluster.json   the nodes and the arguments each server runs with
//	DIR/addrs          comma-separated gRPC addresses (for --cluster)
//	DIR/nK/data/       node K's data
//	DIR/nK/pid         node K's process ID while it runs
//	DIR/nK/log         node K's output
type localCluster struct {
	Dir   string      `json:"-"`
	Nodes []localNode `json:"nodes"`
	// Host and BasePort are cluster up's --host and --base-port, and
	// ServerArgs its --server-args: cluster add places and runs a new node
	// the same way.
	Host       string   `json:"host,omitempty"`
	BasePort   int      `json:"base_port,omitempty"`
	ServerArgs []string `json:"server_args,omitempty"`
}

type localNode struct {
	ID   string   `json:"id"`
	Addr string   `json:"addr"`
	HTTP string   `json:"http"`
	Args []string `json:"args"`
}

func runCluster(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, "usage: raftps cluster up|add|down|kill NODE|restart NODE --dir D")
		return 2
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
	base := fs.Int("base-port", 7001, "gRPC port of the first node; node K uses base+K-1, its HTTP port base+100+K-1, its gossip port base+1000+K-1")
	wait := fs.Duration("wait", 30*time.Second, "how long to wait for the cluster to serve")
	extra := fs.String("server-args", "", "extra arguments for every server, space-separated (e.g. \"--heartbeat-timeout 300ms\")")
	if rc := parse(fs, args, stderr); rc >= 0 {
		return rc
	}
	if *dir == "" || *n < 1 {
		return fail(stderr, "cluster up", fmt.Errorf("--dir is required and --nodes must be at least 1"))
	}
	if _, err := os.Stat(filepath.Join(*dir, "cluster.json")); err == nil {
		return fail(stderr, "cluster up", fmt.Errorf("%s already holds a cluster: use 'raftps cluster down --dir %s' and remove it, or another --dir", *dir, *dir))
	}
	c := &localCluster{Dir: *dir, Host: *host, BasePort: *base, ServerArgs: strings.Fields(*extra)}
	var peers []string
	for i := range *n {
		nd := localNode{ID: fmt.Sprintf("n%d", i+1), Addr: fmt.Sprintf("%s:%d", *host, *base+i), HTTP: fmt.Sprintf("%s:%d", *host, *base+100+i)}
		c.Nodes = append(c.Nodes, nd)
		peers = append(peers, nd.ID+"="+nd.Addr)
	}
	for i := range c.Nodes {
		nd := &c.Nodes[i]
		nd.Args = []string{"server", "--id", nd.ID, "--addr", nd.Addr, "--http", nd.HTTP,
			"--data-dir", filepath.Join(*dir, nd.ID, "data"), "--peers", strings.Join(peers, ",")}
		nd.Args = append(nd.Args, strings.Fields(*extra)...)
	}
	for _, nd := range c.Nodes {
		if err := nd.portsFree(); err != nil {
			return fail(stderr, "cluster up", err)
		}
	}
	if err := c.save(); err != nil {
		return fail(stderr, "cluster up", err)
	}
	for _, nd := range c.Nodes {
		if err := c.start(nd); err != nil {
			c.stopAll(stderr)
			return fail(stderr, "cluster up", err)
		}
		fmt.Fprintf(stderr, "started %s on %s (log %s)\n", nd.ID, nd.Addr, filepath.Join(*dir, nd.ID, "log"))
	}
	if err := c.waitServing(*wait, stderr); err != nil {
		c.stopAll(stderr)
		return fail(stderr, "cluster up", fmt.Errorf("%w (logs are in %s/n*/log; the nodes that started were stopped)", err, *dir))
	}
	fmt.Fprintf(stdout, "cluster of %d nodes serving at %s\n", len(c.Nodes), c.addrs())
	fmt.Fprintf(stdout, "  export RAFTPS_CLUSTER=%s\n  raftps status\n  raftps cluster down --dir %s\n", c.addrs(), *dir)
	return 0
}

// portsFree checks the node's gRPC, HTTP and gossip ports: one held by
// another process (often a node of another local cluster) would make this
// node exit, and the other process could answer in its place.
func (nd localNode) portsFree() error {
	gossip, err := shard.DefaultGossipAddr(nd.Addr)
	if err != nil {
		return err
	}
	for _, addr := range []string{nd.Addr, nd.HTTP, gossip} {
		if err := portFree(addr); err != nil {
			return fmt.Errorf("%s cannot use %s: %w (another cluster running? 'raftps cluster down --dir DIR', or pick another --base-port)", nd.ID, addr, err)
		}
	}
	return nil
}

// clusterAdd starts one more node that joins the running cluster (an
// elastic cluster: the scheduler moves replicas onto it), with the next ID
// and ports, and records it so cluster kill, restart and down know it.
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
	nd, err := c.nextNode()
	if err != nil {
		return fail(stderr, "cluster add", err)
	}
	serverArgs := c.ServerArgs
	if *extra != "" {
		serverArgs = strings.Fields(*extra)
	}
	// Join through the running nodes first: any one that answers will do.
	var running, stopped []string
	for _, o := range c.Nodes {
		if _, alive := c.pid(o.ID); alive {
			running = append(running, o.Addr)
		} else {
			stopped = append(stopped, o.Addr)
		}
	}
	if len(running) == 0 {
		return fail(stderr, "cluster add", fmt.Errorf("no node of the cluster in %s is running: 'raftps cluster restart NODE --dir %s' first", *dir, *dir))
	}
	nd.Args = []string{"server", "--id", nd.ID, "--addr", nd.Addr, "--http", nd.HTTP,
		"--data-dir", filepath.Join(*dir, nd.ID, "data"), "--join", strings.Join(append(running, stopped...), ",")}
	nd.Args = append(nd.Args, serverArgs...)
	if err := nd.portsFree(); err != nil {
		return fail(stderr, "cluster add", err)
	}
	c.Nodes = append(c.Nodes, nd)
	if err := c.save(); err != nil {
		return fail(stderr, "cluster add", err)
	}
	// forget takes the node out of the state file again if it never served.
	forget := func() {
		_ = c.stop(nd.ID, syscall.SIGTERM, 10*time.Second)
		c.Nodes = c.Nodes[:len(c.Nodes)-1]
		if err := c.save(); err != nil {
			fmt.Fprintf(stderr, "raftps cluster add: %v\n", err)
		}
	}
	if err := c.start(nd); err != nil {
		forget()
		return fail(stderr, "cluster add", err)
	}
	fmt.Fprintf(stderr, "started %s on %s (log %s)\n", nd.ID, nd.Addr, filepath.Join(*dir, nd.ID, "log"))
	err = c.waitServing(*wait, stderr)
	if err == nil {
		err = c.waitRegistered(nd.ID, *wait, stderr)
	}
	if err != nil {
		forget()
		return fail(stderr, "cluster add", fmt.Errorf("%w (%s was stopped and left out of %s/cluster.json; its log is %s)", err, nd.ID, *dir, filepath.Join(*dir, nd.ID, "log")))
	}
	fmt.Fprintf(stdout, "%s joined the cluster at %s; replicas move onto it at the scheduler's pace ('raftps status')\n", nd.ID, nd.Addr)
	fmt.Fprintf(stdout, "  export RAFTPS_CLUSTER=%s\n", c.addrs())
	return 0
}

// nextNode returns the node after the last one: ID nK+1, and the ports of
// node K+1 by cluster up's scheme.
func (c *localCluster) nextNode() (localNode, error) {
	k := 0
	for _, nd := range c.Nodes {
		if i, err := strconv.Atoi(strings.TrimPrefix(nd.ID, "n")); err == nil && strings.HasPrefix(nd.ID, "n") {
			k = max(k, i)
		}
	}
	host, base := c.Host, c.BasePort
	if base == 0 {
		// A cluster.json from before host and base_port were recorded:
		// node n1 has the base port.
		n1, err := c.node("n1")
		if err != nil {
			return localNode{}, fmt.Errorf("cannot tell the cluster's base port: %w", err)
		}
		h, p, err := net.SplitHostPort(n1.Addr)
		if err != nil {
			return localNode{}, fmt.Errorf("n1's address %q: %w", n1.Addr, err)
		}
		host = h
		if base, err = strconv.Atoi(p); err != nil {
			return localNode{}, fmt.Errorf("n1's address %q: %w", n1.Addr, err)
		}
	}
	return localNode{ID: fmt.Sprintf("n%d", k+1), Addr: net.JoinHostPort(host, strconv.Itoa(base+k)), HTTP: net.JoinHostPort(host, strconv.Itoa(base+100+k))}, nil
}

// waitRegistered waits until the metadata leader's map has the node.
func (c *localCluster) waitRegistered(id string, timeout time.Duration, stderr io.Writer) error {
	cl, err := shard.NewClient(shard.ClientConfig{Addrs: strings.Split(c.addrs(), ",")})
	if err != nil {
		return err
	}
	defer cl.Close()
	deadline := time.Now().Add(timeout)
	next := time.Now().Add(2 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		cm, err := cl.ClusterMap(ctx)
		cancel()
		if err == nil {
			for _, nd := range cm.Nodes {
				if nd.Id == id {
					return nil
				}
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not registered in the cluster map after %s (last error: %v)", id, timeout, err)
		}
		if time.Now().After(next) {
			fmt.Fprintf(stderr, "waiting for %s to register ...\n", id)
			next = time.Now().Add(2 * time.Second)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (c *localCluster) addrs() string {
	var a []string
	for _, nd := range c.Nodes {
		a = append(a, nd.Addr)
	}
	return strings.Join(a, ",")
}

func (c *localCluster) save() error {
	if err := os.MkdirAll(c.Dir, 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(c.Dir, "cluster.json"), b, 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(c.Dir, "addrs"), []byte(c.addrs()+"\n"), 0o644)
}

func loadCluster(dir string) (*localCluster, error) {
	if dir == "" {
		return nil, fmt.Errorf("--dir is required")
	}
	b, err := os.ReadFile(filepath.Join(dir, "cluster.json"))
	if err != nil {
		return nil, fmt.Errorf("no local cluster in %s: %w", dir, err)
	}
	c := &localCluster{Dir: dir}
	if err := json.Unmarshal(b, c); err != nil {
		return nil, fmt.Errorf("%s/cluster.json: %w", dir, err)
	}
	return c, nil
}

func (c *localCluster) node(id string) (localNode, error) {
	for _, nd := range c.Nodes {
		if nd.ID == id {
			return nd, nil
		}
	}
	return localNode{}, fmt.Errorf("no node %q in %s (nodes: %s)", id, c.Dir, c.addrs())
}

// start runs a node's server as its own process (its own session, so it
// outlives this command), output appended to its log.
func (c *localCluster) start(nd localNode) error {
	if pid, alive := c.pid(nd.ID); alive {
		return fmt.Errorf("%s is already running (pid %d)", nd.ID, pid)
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	ndir := filepath.Join(c.Dir, nd.ID)
	if err := os.MkdirAll(ndir, 0o755); err != nil {
		return err
	}
	log, err := os.OpenFile(filepath.Join(ndir, "log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer log.Close()
	cmd := exec.Command(self, nd.Args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %w", nd.ID, err)
	}
	if err := os.WriteFile(filepath.Join(ndir, "pid"), []byte(strconv.Itoa(cmd.Process.Pid)+"\n"), 0o644); err != nil {
		return err
	}
	// Reap it in the background if this command outlives it; otherwise init will.
	go cmd.Wait()
	return nil
}

// pid returns a node's recorded process ID and whether that process is alive.
func (c *localCluster) pid(id string) (int, bool) {
	b, err := os.ReadFile(filepath.Join(c.Dir, id, "pid"))
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0, false
	}
	return pid, syscall.Kill(pid, 0) == nil && !isZombie(pid)
}

func isZombie(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// Field 3, after the parenthesised command name.
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2] == 'Z'
	}
	return false
}

// stop signals a node and waits for it to exit; SIGKILL after grace.
func (c *localCluster) stop(id string, sig syscall.Signal, grace time.Duration) error {
	pid, alive := c.pid(id)
	if !alive {
		os.Remove(filepath.Join(c.Dir, id, "pid"))
		return nil
	}
	if err := syscall.Kill(pid, sig); err != nil {
		return fmt.Errorf("signalling %s (pid %d): %w", id, pid, err)
	}
	deadline := time.Now().Add(grace)
	for {
		if _, alive := c.pid(id); !alive {
			break
		}
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			deadline = time.Now().Add(5 * time.Second)
			grace = 0
		}
		time.Sleep(10 * time.Millisecond)
	}
	return os.Remove(filepath.Join(c.Dir, id, "pid"))
}

func (c *localCluster) stopAll(stderr io.Writer) {
	for _, nd := range c.Nodes {
		if err := c.stop(nd.ID, syscall.SIGTERM, 10*time.Second); err != nil {
			fmt.Fprintf(stderr, "stopping %s: %v\n", nd.ID, err)
		}
	}
}

// portFree checks addr's TCP port, and its UDP port too (gossip uses both).
func portFree(addr string) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	l.Close()
	u, err := net.ListenPacket("udp", addr)
	if err != nil {
		return err
	}
	return u.Close()
}

// logTail returns the last lines of a node's log, for error messages.
func (c *localCluster) logTail(id string, lines int) string {
	b, _ := os.ReadFile(filepath.Join(c.Dir, id, "log"))
	all := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(all[max(0, len(all)-lines):], "\n")
}

// waitServing waits until every node that has a pid file runs, answers
// Status as itself, and knows a metadata leader. A node that died is an
// error (with the end of its log); a node killed on purpose (cluster kill)
// has no pid file and is skipped.
func (c *localCluster) waitServing(timeout time.Duration, stderr io.Writer) error {
	cl, err := shard.NewClient(shard.ClientConfig{Addrs: strings.Split(c.addrs(), ",")})
	if err != nil {
		return err
	}
	defer cl.Close()
	deadline := time.Now().Add(timeout)
	next := time.Now().Add(2 * time.Second)
	for {
		var waiting []string
		for _, nd := range c.Nodes {
			if _, alive := c.pid(nd.ID); !alive {
				if _, err := os.Stat(filepath.Join(c.Dir, nd.ID, "pid")); err == nil {
					return fmt.Errorf("%s exited; the end of its log:\n%s", nd.ID, c.logTail(nd.ID, 10))
				}
				continue
			}
			// The HTTP server starts last: until it answers, the node
			// may still be starting, and a Status call then can crash it
			// (shard: Status reads the gossip view before it exists).
			if nd.HTTP != "" && !httpUp(nd.HTTP) {
				waiting = append(waiting, nd.ID)
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			st, err := cl.Status(ctx, nd.Addr)
			cancel()
			if err == nil && st.NodeId != nd.ID {
				return fmt.Errorf("%s answers as node %q, not %s: another process holds the port", nd.Addr, st.NodeId, nd.ID)
			}
			if err != nil || len(st.Replicas) == 0 || st.Replicas[0].LeaderId == "" {
				waiting = append(waiting, nd.ID)
			}
		}
		if len(waiting) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("nodes %s not serving after %s", strings.Join(waiting, ", "), timeout)
		}
		if time.Now().After(next) {
			fmt.Fprintf(stderr, "waiting for %s ...\n", strings.Join(waiting, ", "))
			next = time.Now().Add(2 * time.Second)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// httpUp reports whether a node's HTTP server answers at all (/healthz says
// 503 while the node knows no metadata leader: that is an answer too).
func httpUp(addr string) bool {
	hc := http.Client{Timeout: time.Second}
	resp, err := hc.Get("http://" + addr + "/healthz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return true
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
	c.stopAll(stderr)
	fmt.Fprintf(stdout, "cluster in %s stopped (data kept; remove the directory to discard it)\n", *dir)
	return 0
}

func clusterNode(verb string, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("raftps cluster "+verb+" NODE", flag.ContinueOnError)
	dir := fs.String("dir", "", "the cluster's directory (required)")
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		fmt.Fprintf(stderr, "usage: raftps cluster %s NODE --dir D\n", verb)
		return 2
	}
	id := args[0]
	if rc := parse(fs, args[1:], stderr); rc >= 0 {
		return rc
	}
	c, err := loadCluster(*dir)
	if err != nil {
		return fail(stderr, "cluster "+verb, err)
	}
	nd, err := c.node(id)
	if err != nil {
		return fail(stderr, "cluster "+verb, err)
	}
	if verb == "kill" {
		if _, alive := c.pid(id); !alive {
			return fail(stderr, "cluster kill", errors.New(id+" is not running"))
		}
		if err := c.stop(id, syscall.SIGKILL, 5*time.Second); err != nil {
			return fail(stderr, "cluster kill", err)
		}
		fmt.Fprintf(stdout, "killed %s\n", id)
		return 0
	}
	if err := c.stop(id, syscall.SIGTERM, 10*time.Second); err != nil {
		return fail(stderr, "cluster restart", err)
	}
	if err := c.start(nd); err != nil {
		return fail(stderr, "cluster restart", err)
	}
	if err := c.waitServing(30*time.Second, stderr); err != nil {
		return fail(stderr, "cluster restart", err)
	}
	fmt.Fprintf(stdout, "restarted %s\n", id)
	return 0
}
