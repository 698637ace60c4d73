package localcluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/raftps/raftps/shard"
	"github.com/raftps/raftps/shard/client"
)

// Cluster is a local cluster's state, as DIR/cluster.json keeps it.
type Cluster struct {
	Dir   string `json:"-"`
	Nodes []Node `json:"nodes"`
	// Host and BasePort are Up's, and ServerArgs its extra server
	// arguments: Add places and runs a new node the same way.
	Host       string   `json:"host,omitempty"`
	BasePort   int      `json:"base_port,omitempty"`
	ServerArgs []string `json:"server_args,omitempty"`
	// Binary is the raftps binary the servers run; empty: this process's
	// own executable. Kept in the state file, so that a test process that
	// loads a cluster it did not start restarts its nodes with the binary
	// they ran, not with itself.
	Binary string `json:"binary,omitempty"`

	faultMu  sync.Mutex      // guards isolated
	isolated map[string]bool // node IDs cut off (faults.go)
}

// Node is one server of a local cluster: its addresses and the arguments
// it runs with.
type Node struct {
	ID       string   `json:"id"`
	Addr     string   `json:"addr"`
	PeerAddr string   `json:"peer_addr"`
	HTTP     string   `json:"http"`
	Args     []string `json:"args"`
}

// GossipAddr is the node's gossip address (the server's default).
func (nd Node) GossipAddr() string {
	a, _ := shard.DefaultGossipAddr(nd.Addr)
	return a
}

// UpConfig configures Up.
type UpConfig struct {
	Dir      string
	Nodes    int
	Host     string // default 127.0.0.1
	BasePort int    // default 7001
	// ServerArgs are added to every server's arguments.
	ServerArgs []string
	// CADir, if set, is a directory with a CA (ca.crt, ca.key, gossip.key)
	// to sign the cluster's certificates with, instead of a new one.
	CADir string
	// Wait bounds the wait for the cluster to serve (default 30s).
	Wait   time.Duration
	Binary string
	// Progress, if set, hears what Up is doing.
	Progress io.Writer
}

// nodeAt is node k (from 1) of a cluster at host and base port.
func nodeAt(host string, base, k int) (Node, error) {
	nd := Node{ID: fmt.Sprintf("n%d", k), Addr: net.JoinHostPort(host, strconv.Itoa(base+k-1)), HTTP: net.JoinHostPort(host, strconv.Itoa(base+100+k-1))}
	var err error
	nd.PeerAddr, err = shard.DefaultPeerAddr(nd.Addr)
	return nd, err
}

// Up starts a static cluster of cfg.Nodes servers in cfg.Dir, which must
// not hold one, and waits until every node serves. If any fails to, the
// nodes that started are stopped.
func Up(cfg UpConfig) (*Cluster, error) {
	if cfg.Dir == "" || cfg.Nodes < 1 {
		return nil, errors.New("local cluster: a directory and at least one node are needed")
	}
	if cfg.Host == "" {
		cfg.Host = "127.0.0.1"
	}
	if cfg.BasePort == 0 {
		cfg.BasePort = 7001
	}
	if cfg.Wait <= 0 {
		cfg.Wait = 30 * time.Second
	}
	progress := progressOf(cfg.Progress)
	if _, err := os.Stat(filepath.Join(cfg.Dir, "cluster.json")); err == nil {
		return nil, fmt.Errorf("%s already holds a cluster: stop it ('raftps cluster down --dir %s') and remove it, or use another directory", cfg.Dir, cfg.Dir)
	}
	c := &Cluster{Dir: cfg.Dir, Host: cfg.Host, BasePort: cfg.BasePort, ServerArgs: cfg.ServerArgs, Binary: cfg.Binary}
	var peers []string
	for k := 1; k <= cfg.Nodes; k++ {
		nd, err := nodeAt(cfg.Host, cfg.BasePort, k)
		if err != nil {
			return nil, err
		}
		c.Nodes = append(c.Nodes, nd)
		peers = append(peers, nd.ID+"="+nd.PeerAddr)
	}
	for _, nd := range c.Nodes {
		if err := nd.portsFree(); err != nil {
			return nil, err
		}
	}
	if err := c.makeCA(cfg.CADir); err != nil {
		return nil, err
	}
	for i := range c.Nodes {
		nd := &c.Nodes[i]
		tlsArgs, err := c.makeNode(*nd)
		if err != nil {
			return nil, err
		}
		nd.Args = append(append([]string{"server", "--id", nd.ID, "--addr", nd.Addr, "--http", nd.HTTP,
			"--data-dir", filepath.Join(cfg.Dir, nd.ID, "data"), "--peers", strings.Join(peers, ",")}, tlsArgs...), cfg.ServerArgs...)
	}
	if err := c.save(); err != nil {
		return nil, err
	}
	for _, nd := range c.Nodes {
		if err := c.Start(nd); err != nil {
			c.StopAll(cfg.Progress)
			return nil, err
		}
		fmt.Fprintf(progress, "started %s on %s (log %s)\n", nd.ID, nd.Addr, filepath.Join(cfg.Dir, nd.ID, "log"))
	}
	if err := c.WaitServing(cfg.Wait, cfg.Progress); err != nil {
		c.StopAll(cfg.Progress)
		return nil, fmt.Errorf("%w (logs are in %s/n*/log; the nodes that started were stopped)", err, cfg.Dir)
	}
	return c, nil
}

// Load reads the cluster in dir.
func Load(dir string) (*Cluster, error) {
	if dir == "" {
		return nil, errors.New("local cluster: no directory given")
	}
	b, err := os.ReadFile(filepath.Join(dir, "cluster.json"))
	if err != nil {
		return nil, fmt.Errorf("no local cluster in %s: %w", dir, err)
	}
	c := &Cluster{Dir: dir}
	if err := json.Unmarshal(b, c); err != nil {
		return nil, fmt.Errorf("%s/cluster.json: %w", dir, err)
	}
	return c, nil
}

// Add starts one more node, the next ID with the next ports, that joins
// the running cluster (serverArgs: its extra arguments; nil: Up's), waits
// until it serves and is registered in the cluster map, and records it. A
// node that does not get that far is stopped and left out.
func (c *Cluster) Add(serverArgs []string, wait time.Duration, progress io.Writer) (Node, error) {
	nd, err := c.nextNode()
	if err != nil {
		return Node{}, err
	}
	if serverArgs == nil {
		serverArgs = c.ServerArgs
	}
	// Join through the running nodes first: any one that answers will do.
	var running, stopped []string
	for _, o := range c.Nodes {
		if _, alive := c.PID(o.ID); alive {
			running = append(running, o.PeerAddr)
		} else {
			stopped = append(stopped, o.PeerAddr)
		}
	}
	if len(running) == 0 {
		return Node{}, fmt.Errorf("no node of the cluster in %s is running: 'raftps cluster restart NODE --dir %s' first", c.Dir, c.Dir)
	}
	if err := nd.portsFree(); err != nil {
		return Node{}, err
	}
	tlsArgs, err := c.makeNode(nd)
	if err != nil {
		return Node{}, err
	}
	nd.Args = append(append([]string{"server", "--id", nd.ID, "--addr", nd.Addr, "--http", nd.HTTP,
		"--data-dir", filepath.Join(c.Dir, nd.ID, "data"), "--join", strings.Join(append(running, stopped...), ",")}, tlsArgs...), serverArgs...)
	c.Nodes = append(c.Nodes, nd)
	if err := c.save(); err != nil {
		return Node{}, err
	}
	// forget takes the node out of the state file again if it never served.
	forget := func(cause error) error {
		_ = c.Stop(nd.ID, syscall.SIGTERM, 10*time.Second)
		c.Nodes = c.Nodes[:len(c.Nodes)-1]
		if err := c.save(); err != nil {
			return errors.Join(cause, err)
		}
		return cause
	}
	if err := c.Start(nd); err != nil {
		return Node{}, forget(err)
	}
	fmt.Fprintf(progressOf(progress), "started %s on %s (log %s)\n", nd.ID, nd.Addr, filepath.Join(c.Dir, nd.ID, "log"))
	err = c.WaitServing(wait, progress)
	if err == nil {
		err = c.WaitRegistered(nd.ID, wait, progress)
	}
	if err != nil {
		return Node{}, forget(fmt.Errorf("%w (%s was stopped and left out of %s/cluster.json; its log is %s)", err, nd.ID, c.Dir, filepath.Join(c.Dir, nd.ID, "log")))
	}
	return nd, nil
}

// nextNode returns the node after the last one: ID nK+1, and the ports of
// node K+1 by Up's scheme.
func (c *Cluster) nextNode() (Node, error) {
	k := 0
	for _, nd := range c.Nodes {
		if i, err := strconv.Atoi(strings.TrimPrefix(nd.ID, "n")); err == nil && strings.HasPrefix(nd.ID, "n") {
			k = max(k, i)
		}
	}
	if c.BasePort == 0 {
		return Node{}, fmt.Errorf("%s/cluster.json records no base port", c.Dir)
	}
	return nodeAt(c.Host, c.BasePort, k+1)
}

// Addrs returns every node's client address.
func (c *Cluster) Addrs() []string {
	var a []string
	for _, nd := range c.Nodes {
		a = append(a, nd.Addr)
	}
	return a
}

// Node returns the node with ID id.
func (c *Cluster) Node(id string) (Node, error) {
	for _, nd := range c.Nodes {
		if nd.ID == id {
			return nd, nil
		}
	}
	return Node{}, fmt.Errorf("no node %q in %s (nodes: %s)", id, c.Dir, strings.Join(c.Addrs(), ","))
}

func (c *Cluster) save() error {
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
	if err := os.WriteFile(filepath.Join(c.Dir, "addrs"), []byte(strings.Join(c.Addrs(), ",")+"\n"), 0o644); err != nil {
		return err
	}
	return c.writeEnv()
}

// Start runs a node's server as its own process (its own session, so it
// outlives the caller), output appended to its log.
func (c *Cluster) Start(nd Node) error {
	if pid, alive := c.PID(nd.ID); alive {
		return fmt.Errorf("%s is already running (pid %d)", nd.ID, pid)
	}
	bin := c.Binary
	if bin == "" {
		var err error
		if bin, err = os.Executable(); err != nil {
			return err
		}
	}
	ndir := filepath.Join(c.Dir, nd.ID)
	if err := os.MkdirAll(ndir, 0o755); err != nil {
		return err
	}
	waitPortsFree(nd, 10*time.Second)
	log, err := os.OpenFile(filepath.Join(ndir, "log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer log.Close()
	cmd := exec.Command(bin, nd.Args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %w", nd.ID, err)
	}
	if err := os.WriteFile(filepath.Join(ndir, "pid"), []byte(strconv.Itoa(cmd.Process.Pid)+"\n"), 0o644); err != nil {
		return err
	}
	// Reap it in the background if the caller outlives it; otherwise init will.
	go cmd.Wait()
	return nil
}

// PID returns a node's recorded process ID and whether that process is
// alive (a zombie is not).
func (c *Cluster) PID(id string) (int, bool) {
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

// isZombie says whether pid has exited and only waits to be reaped. The
// state of /proc/PID/stat is the thread group leader's alone: a killed
// process whose main thread is gone while another still finishes a system
// call (an fdatasync on a loaded disk) shows Z while it still holds its
// files and listening sockets, and a node started again at once on its
// ports fails with "address already in use". So all its threads must be
// gone too.
func isZombie(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// Field 3, after the parenthesised command name.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) || s[i+2] != 'Z' {
		return false
	}
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	return err != nil || len(tasks) <= 1
}

// waitPortsFree waits, up to timeout, until nd's TCP ports can be bound
// again: a node stopped a moment ago may still hold them (see isZombie).
// If they cannot, the node is started anyway and says which port is taken.
func waitPortsFree(nd Node, timeout time.Duration) {
	free := func() bool {
		for _, a := range []string{nd.Addr, nd.PeerAddr, nd.HTTP, nd.GossipAddr()} {
			if a == "" {
				continue
			}
			l, err := net.Listen("tcp", a)
			if err != nil {
				return false
			}
			l.Close()
		}
		return true
	}
	for deadline := time.Now().Add(timeout); !free() && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
	}
}

// Signal sends a running node sig.
func (c *Cluster) Signal(id string, sig syscall.Signal) error {
	pid, alive := c.PID(id)
	if !alive {
		return fmt.Errorf("%s is not running", id)
	}
	return syscall.Kill(pid, sig)
}

// Stop signals a node and waits for it to exit, with SIGKILL after grace.
// A node that is not running is stopped already.
func (c *Cluster) Stop(id string, sig syscall.Signal, grace time.Duration) error {
	pid, alive := c.PID(id)
	if !alive {
		os.Remove(filepath.Join(c.Dir, id, "pid"))
		return nil
	}
	if err := syscall.Kill(pid, sig); err != nil {
		return fmt.Errorf("signalling %s (pid %d): %w", id, pid, err)
	}
	deadline := time.Now().Add(grace)
	for {
		if _, alive := c.PID(id); !alive {
			break
		}
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			deadline = time.Now().Add(5 * time.Second)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return os.Remove(filepath.Join(c.Dir, id, "pid"))
}

// Kill stops a running node with SIGKILL.
func (c *Cluster) Kill(id string) error {
	if _, alive := c.PID(id); !alive {
		return fmt.Errorf("%s is not running", id)
	}
	return c.Stop(id, syscall.SIGKILL, 5*time.Second)
}

// Restart stops a node (SIGTERM) if it runs, starts it again from its data
// and waits until the cluster serves.
func (c *Cluster) Restart(id string, wait time.Duration, progress io.Writer) error {
	nd, err := c.Node(id)
	if err != nil {
		return err
	}
	if err := c.Stop(id, syscall.SIGTERM, 10*time.Second); err != nil {
		return err
	}
	if err := c.Start(nd); err != nil {
		return err
	}
	return c.WaitServing(wait, progress)
}

// StopAll stops every node (SIGTERM, then SIGKILL after 10s); progress, if
// set, hears of a node that did not stop cleanly.
func (c *Cluster) StopAll(progress io.Writer) {
	for _, nd := range c.Nodes {
		if err := c.Stop(nd.ID, syscall.SIGTERM, 10*time.Second); err != nil {
			fmt.Fprintf(progressOf(progress), "stopping %s: %v\n", nd.ID, err)
		}
	}
}

// portsFree checks the node's client, peer, HTTP and gossip ports: one held
// by another process (often a node of another local cluster) would make this
// node exit, and the other process could answer in its place.
func (nd Node) portsFree() error {
	for _, addr := range []string{nd.Addr, nd.PeerAddr, nd.HTTP, nd.GossipAddr()} {
		if err := portFree(addr); err != nil {
			return fmt.Errorf("%s cannot use %s: %w (another cluster running? 'raftps cluster down --dir DIR', or pick another base port)", nd.ID, addr, err)
		}
	}
	return nil
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

// LogTail returns the last lines of a node's log, for error messages.
func (c *Cluster) LogTail(id string, lines int) string {
	b, _ := os.ReadFile(filepath.Join(c.Dir, id, "log"))
	all := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(all[max(0, len(all)-lines):], "\n")
}

// WaitServing waits until every node that has a pid file runs, answers
// Status as itself, and knows a metadata leader. A node that died is an
// error (with the end of its log); a node killed on purpose (Kill) has no
// pid file and is skipped.
func (c *Cluster) WaitServing(timeout time.Duration, progress io.Writer) error {
	cfg, err := c.ClientConfig()
	if err != nil {
		return err
	}
	cl, err := client.New(cfg)
	if err != nil {
		return err
	}
	defer cl.Close()
	deadline := time.Now().Add(timeout)
	next := time.Now().Add(2 * time.Second)
	for {
		var waiting []string
		for _, nd := range c.Nodes {
			if _, alive := c.PID(nd.ID); !alive {
				if _, err := os.Stat(filepath.Join(c.Dir, nd.ID, "pid")); err == nil {
					return fmt.Errorf("%s exited; the end of its log:\n%s", nd.ID, c.LogTail(nd.ID, 10))
				}
				continue
			}
			// The HTTP server starts last: until it answers, the node is
			// still starting.
			if nd.HTTP != "" && !httpUp(nd.HTTP) {
				waiting = append(waiting, nd.ID)
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			st, err := cl.Admin().NodeStatus(ctx, nd.Addr, false)
			cancel()
			if err == nil && st.NodeID != nd.ID {
				return fmt.Errorf("%s answers as node %q, not %s: another process holds the port", nd.Addr, st.NodeID, nd.ID)
			}
			if err != nil || len(st.Replicas) == 0 || st.Replicas[0].Leader == "" {
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
			fmt.Fprintf(progressOf(progress), "waiting for %s ...\n", strings.Join(waiting, ", "))
			next = time.Now().Add(2 * time.Second)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// WaitRegistered waits until the metadata leader's map has node id.
func (c *Cluster) WaitRegistered(id string, timeout time.Duration, progress io.Writer) error {
	cfg, err := c.ClientConfig()
	if err != nil {
		return err
	}
	cl, err := client.New(cfg)
	if err != nil {
		return err
	}
	defer cl.Close()
	deadline := time.Now().Add(timeout)
	next := time.Now().Add(2 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		cm, err := cl.Admin().ClusterMap(ctx)
		cancel()
		if err == nil {
			if _, ok := cm.Node(id); ok {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not registered in the cluster map after %s (last error: %v)", id, timeout, err)
		}
		if time.Now().After(next) {
			fmt.Fprintf(progressOf(progress), "waiting for %s to register ...\n", id)
			next = time.Now().Add(2 * time.Second)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// CheckHealth returns nil if http://addr/healthz answers 200 within
// timeout, else why not (raftps health, a container's healthcheck).
func CheckHealth(addr string, timeout time.Duration) error {
	hc := http.Client{Timeout: timeout}
	resp, err := hc.Get("http://" + addr + "/healthz")
	if err != nil {
		return fmt.Errorf("%s: no answer: %v", addr, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		msg := strings.TrimSpace(string(body))
		if msg == "" {
			msg = "(no body)"
		}
		return fmt.Errorf("%s: unhealthy: %s: %s", addr, resp.Status, msg)
	}
	return nil
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

func progressOf(w io.Writer) io.Writer {
	if w == nil {
		return io.Discard
	}
	return w
}
