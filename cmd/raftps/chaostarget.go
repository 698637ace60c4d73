package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/raftps/raftps/shard"
)

// chaosTarget is a cluster chaos can hurt: by node ID, it kills and starts
// a node's process or container, pauses and resumes it, and cuts it off the
// network and back.
type chaosTarget interface {
	name() string
	// addrs returns gRPC addresses of the cluster's nodes, for clients.
	addrs() ([]string, error)
	kill(id string) error
	start(id string) error
	pause(id string) error
	resume(id string) error
	// isolate cuts a node off from every other node and from clients;
	// reconnect undoes it.
	isolate(id string) error
	reconnect(id string) error
}

// errNoPartition: the target cannot cut the network.
var errNoPartition = errors.New("this local cluster cannot be partitioned: its nodes were not started with --fault-injection (raftps cluster up --server-args --fault-injection), or use --target docker:PROJECT")

// parseTarget reads local:DIR or docker:PROJECT.
func parseTarget(s string) (chaosTarget, error) {
	kind, arg, ok := strings.Cut(s, ":")
	switch {
	case !ok || arg == "":
		return nil, fmt.Errorf("--target %q: want local:DIR (a raftps cluster up directory) or docker:PROJECT (a compose project)", s)
	case kind == "local":
		c, err := loadCluster(arg)
		if err != nil {
			return nil, fmt.Errorf("--target %q: %w", s, err)
		}
		return &localTarget{c: c}, nil
	case kind == "docker":
		return newDockerTarget(arg)
	}
	return nil, fmt.Errorf("--target %q: unknown kind %q (want local or docker)", s, kind)
}

// localTarget is a cluster of processes started by raftps cluster up.
// Partitions go through each node's /debug/netfault (the nodes must run
// with --fault-injection): a cut-off node blocks every other node's gRPC
// and gossip addresses, and every other node blocks its; clients still
// reach it.
type localTarget struct {
	c *localCluster

	mu       sync.Mutex
	isolated map[string]bool // node IDs cut off
}

func (t *localTarget) name() string { return "local:" + t.c.Dir }

func (t *localTarget) addrs() ([]string, error) {
	var out []string
	for _, nd := range t.c.Nodes {
		out = append(out, nd.Addr)
	}
	return out, nil
}

func (t *localTarget) kill(id string) error { return t.c.stop(id, syscall.SIGKILL, 0) }

func (t *localTarget) start(id string) error {
	nd, err := t.c.node(id)
	if err != nil {
		return err
	}
	return t.c.start(nd)
}

func (t *localTarget) signal(id string, sig syscall.Signal) error {
	pid, alive := t.c.pid(id)
	if !alive {
		return fmt.Errorf("%s is not running", id)
	}
	if err := syscall.Kill(pid, sig); err != nil {
		return fmt.Errorf("signalling %s (pid %d): %w", id, pid, err)
	}
	return nil
}

func (t *localTarget) pause(id string) error  { return t.signal(id, syscall.SIGSTOP) }
func (t *localTarget) resume(id string) error { return t.signal(id, syscall.SIGCONT) }

// canPartition: every node runs with --fault-injection.
func (t *localTarget) canPartition() bool {
	for _, nd := range t.c.Nodes {
		if !slices.ContainsFunc(nd.Args, func(a string) bool { return a == "--fault-injection" || a == "--fault-injection=true" }) {
			return false
		}
	}
	return len(t.c.Nodes) > 0
}

func (t *localTarget) isolate(id string) error {
	if _, err := t.c.node(id); err != nil {
		return err
	}
	if !t.canPartition() {
		return errNoPartition
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.isolated == nil {
		t.isolated = map[string]bool{}
	}
	t.isolated[id] = true
	return t.applyLocked()
}

func (t *localTarget) reconnect(id string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.isolated[id] {
		return nil
	}
	delete(t.isolated, id)
	return t.applyLocked()
}

// applyLocked tells every node which peers to block: an isolated node all
// others, every other node the isolated ones. A node that does not answer
// (killed, paused) is skipped: it starts with nothing blocked, and the next
// change reaches it.
func (t *localTarget) applyLocked() error {
	peerAddrs := func(nd localNode) []string {
		gossip := gossipAddrOf(nd)
		return []string{nd.Addr, gossip}
	}
	var errs []error
	reached := 0
	for _, nd := range t.c.Nodes {
		var block []string
		for _, o := range t.c.Nodes {
			if o.ID != nd.ID && (t.isolated[nd.ID] || t.isolated[o.ID]) {
				block = append(block, peerAddrs(o)...)
			}
		}
		if err := postNetFault(nd.HTTP, block); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", nd.ID, err))
			continue
		}
		reached++
	}
	if reached == 0 {
		return errors.Join(errs...)
	}
	return nil
}

// gossipAddrOf is a local node's gossip address: its --gossip-addr, or the
// default next to its gRPC address.
func gossipAddrOf(nd localNode) string {
	for i, a := range nd.Args {
		if a == "--gossip-addr" && i+1 < len(nd.Args) {
			return nd.Args[i+1]
		}
		if v, ok := strings.CutPrefix(a, "--gossip-addr="); ok {
			return v
		}
	}
	g, _ := shard.DefaultGossipAddr(nd.Addr)
	return g
}

// postNetFault sets the blocked peer addresses of the node whose HTTP
// address is httpAddr.
func postNetFault(httpAddr string, block []string) error {
	hc := http.Client{Timeout: time.Second}
	resp, err := hc.PostForm("http://"+httpAddr+"/debug/netfault", url.Values{"block": {strings.Join(block, ",")}})
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("/debug/netfault: %s: %s", resp.Status, bytes.TrimSpace(b))
	}
	return nil
}

// dockerTarget is a compose project: the services are the node IDs (see
// deploy/docker-compose.yml), each container on one project network.
type dockerTarget struct {
	project    string
	containers map[string]string // node ID -> container name
	ips        map[string]string // node ID -> IP on the network
	network    string
}

// grpcPort is the gRPC port of the nodes in deploy/docker-compose.yml.
const dockerGRPCPort = "7001"

func newDockerTarget(project string) (*dockerTarget, error) {
	out, err := dockerCmd("ps", "-a", "--filter", "label=com.docker.compose.project="+project,
		"--format", `{{.Names}} {{.Label "com.docker.compose.service"}}`)
	if err != nil {
		return nil, err
	}
	t := &dockerTarget{project: project, containers: map[string]string{}, ips: map[string]string{}}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if f := strings.Fields(line); len(f) == 2 {
			t.containers[f[1]] = f[0]
		}
	}
	if len(t.containers) == 0 {
		return nil, fmt.Errorf("no containers of compose project %q (start it: make compose-up)", project)
	}
	for id, c := range t.containers {
		out, err := dockerCmd("inspect", "-f", `{{range $n, $e := .NetworkSettings.Networks}}{{$n}} {{$e.IPAddress}}{{"\n"}}{{end}}`, c)
		if err != nil {
			return nil, err
		}
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			if f := strings.Fields(line); len(f) == 2 {
				t.network, t.ips[id] = f[0], f[1]
			}
		}
	}
	// A disconnected container has no address: read the configured one.
	for id, c := range t.containers {
		if t.ips[id] != "" {
			continue
		}
		out, err := dockerCmd("inspect", "-f", `{{range $n, $e := .NetworkSettings.Networks}}{{$e.IPAMConfig.IPv4Address}}{{end}}`, c)
		if err == nil && strings.TrimSpace(out) != "" {
			t.ips[id] = strings.TrimSpace(out)
		}
	}
	return t, nil
}

func dockerCmd(args ...string) (string, error) {
	var out, stderr bytes.Buffer
	cmd := exec.Command("docker", args...)
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("docker %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out.String(), nil
}

func (t *dockerTarget) name() string { return "docker:" + t.project }

func (t *dockerTarget) addrs() ([]string, error) {
	var out []string
	for id := range t.containers {
		if ip := t.ips[id]; ip != "" {
			out = append(out, ip+":"+dockerGRPCPort)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no container of %q has an address", t.project)
	}
	return out, nil
}

func (t *dockerTarget) container(id string) (string, error) {
	c, ok := t.containers[id]
	if !ok {
		return "", fmt.Errorf("no container for node %q in project %q", id, t.project)
	}
	return c, nil
}

func (t *dockerTarget) do(verb, id string, extra ...string) error {
	c, err := t.container(id)
	if err != nil {
		return err
	}
	_, err = dockerCmd(append(append([]string{verb}, extra...), c)...)
	return err
}

func (t *dockerTarget) kill(id string) error   { return t.do("kill", id) }
func (t *dockerTarget) start(id string) error  { return t.do("start", id) }
func (t *dockerTarget) pause(id string) error  { return t.do("pause", id) }
func (t *dockerTarget) resume(id string) error { return t.do("unpause", id) }

func (t *dockerTarget) isolate(id string) error {
	c, err := t.container(id)
	if err != nil {
		return err
	}
	_, err = dockerCmd("network", "disconnect", "--force", t.network, c)
	return err
}

func (t *dockerTarget) reconnect(id string) error {
	c, err := t.container(id)
	if err != nil {
		return err
	}
	// The static address and the service name (the nodes' DNS alias) are
	// not kept across a disconnect: give both again.
	args := []string{"network", "connect", "--alias", id}
	if ip := t.ips[id]; ip != "" {
		args = append(args, "--ip", ip)
	}
	_, err = dockerCmd(append(args, t.network, c)...)
	if err != nil && strings.Contains(err.Error(), "already exists") {
		return nil
	}
	return err
}
