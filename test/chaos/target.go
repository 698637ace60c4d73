package chaos

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/raftps/raftps/shard/certs"
	"github.com/raftps/raftps/test/localcluster"
	"google.golang.org/grpc"
)

// Target is a cluster chaos can hurt: by node ID, it kills and starts
// a node's process or container, pauses and resumes it, and cuts it off the
// network and back.
type Target interface {
	name() string
	// addrs returns the client addresses of the cluster's nodes.
	addrs() ([]string, error)
	// dialOptions are a client's credentials for the cluster (an admin's).
	dialOptions() ([]grpc.DialOption, error)
	kill(id string) error
	start(id string) error
	pause(id string) error
	resume(id string) error
	// isolate cuts a node off from every other node and from clients;
	// reconnect undoes it.
	isolate(id string) error
	reconnect(id string) error
	// slow makes a node answer d late (0: on time again).
	slow(id string, d time.Duration) error
}

// errNoPartition: the target cannot cut the network.
var errNoPartition = errors.New("this local cluster cannot be partitioned or slowed: its nodes were not started with --fault-injection (a test build's raftps cluster up --server-args --fault-injection: make build-faults makes bin/raftps-faults), or use --target docker:PROJECT")

// ParseTarget reads local:DIR or docker:PROJECT.
func ParseTarget(s string) (Target, error) {
	kind, arg, ok := strings.Cut(s, ":")
	switch {
	case !ok || arg == "":
		return nil, fmt.Errorf("--target %q: want local:DIR (a raftps cluster up directory) or docker:PROJECT (a compose project)", s)
	case kind == "local":
		c, err := localcluster.Load(arg)
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
// Partitions and slow nodes go through each node's /debug/netfault (the
// nodes must run with --fault-injection; localcluster.Cluster.Isolate).
type localTarget struct {
	c *localcluster.Cluster
}

func (t *localTarget) name() string { return "local:" + t.c.Dir }

func (t *localTarget) addrs() ([]string, error) { return t.c.Addrs(), nil }

func (t *localTarget) dialOptions() ([]grpc.DialOption, error) { return t.c.DialOptions() }

func (t *localTarget) kill(id string) error { return t.c.Stop(id, syscall.SIGKILL, 0) }

func (t *localTarget) start(id string) error {
	nd, err := t.c.Node(id)
	if err != nil {
		return err
	}
	return t.c.Start(nd)
}

func (t *localTarget) pause(id string) error  { return t.c.Signal(id, syscall.SIGSTOP) }
func (t *localTarget) resume(id string) error { return t.c.Signal(id, syscall.SIGCONT) }

func (t *localTarget) canPartition() bool { return t.c.CanInjectFaults() }

func (t *localTarget) isolate(id string) error               { return t.c.Isolate(id) }
func (t *localTarget) reconnect(id string) error             { return t.c.Reconnect(id) }
func (t *localTarget) slow(id string, d time.Duration) error { return t.c.Slow(id, d) }

// dockerTarget is a compose project: the services are the node IDs (see
// deploy/docker-compose.yml), each container on one project network.
type dockerTarget struct {
	project    string
	containers map[string]string // node ID -> container name
	ips        map[string]string // node ID -> IP on the network
	network    string
}

// dockerGRPCPort is the client port of the nodes in deploy/docker-compose.yml.
const dockerGRPCPort = "7001"

func newDockerTarget(project string) (*dockerTarget, error) {
	out, err := dockerCmd("ps", "-a", "--filter", "label=com.docker.compose.project="+project,
		"--format", `{{.Names}} {{.Label "com.docker.compose.service"}}`)
	if err != nil {
		return nil, err
	}
	t := &dockerTarget{project: project, containers: map[string]string{}, ips: map[string]string{}}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[1] != certsService {
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

// certsService is the compose file's one-shot service that makes the
// certificates (not a node).
const certsService = "certs"

// dialOptions use the admin client certificate the compose project's certs
// service made, copied out of a node's certificates volume.
func (t *dockerTarget) dialOptions() ([]grpc.DialOption, error) {
	dir, err := os.MkdirTemp("", "raftps-chaos-certs-")
	if err != nil {
		return nil, err
	}
	// The Source reads the files now; when it looks again and finds them
	// gone, it keeps what it read.
	defer os.RemoveAll(dir)
	f := certs.ClientFiles(dir, localcluster.AdminClient)
	ids := slices.Sorted(maps.Keys(t.containers))
	for _, p := range []string{f.CA, f.Cert, f.Key} {
		if _, err := dockerCmd("cp", "-q", t.containers[ids[0]]+":/certs/"+filepath.Base(p), p); err != nil {
			return nil, fmt.Errorf("the admin's certificate from %s: %w", ids[0], err)
		}
	}
	return localcluster.ClientCredentials(f)
}

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

// slow delays every packet the node's container sends by d, with tc netem
// in the container's network namespace (nsenter; tc from iproute2 on the
// host): clients and peers alike hear from it late.
func (t *dockerTarget) slow(id string, d time.Duration) error {
	c, err := t.container(id)
	if err != nil {
		return err
	}
	pid, err := dockerCmd("inspect", "-f", "{{.State.Pid}}", c)
	if err != nil {
		return err
	}
	ns := []string{"-t", strings.TrimSpace(pid), "-n", "tc", "qdisc"}
	if d <= 0 {
		out, err := exec.Command("nsenter", append(ns, "del", "dev", "eth0", "root")...).CombinedOutput()
		if err != nil && !strings.Contains(string(out), "No such file") && !strings.Contains(string(out), "Cannot delete qdisc with handle of zero") {
			return fmt.Errorf("tc qdisc del in %s: %w: %s", c, err, bytes.TrimSpace(out))
		}
		return nil
	}
	ms := fmt.Sprintf("%dms", d.Milliseconds())
	if out, err := exec.Command("nsenter", append(ns, "replace", "dev", "eth0", "root", "netem", "delay", ms)...).CombinedOutput(); err != nil {
		return fmt.Errorf("tc netem delay %s in %s (needs nsenter and tc from iproute2, as root): %w: %s", ms, c, err, bytes.TrimSpace(out))
	}
	return nil
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
