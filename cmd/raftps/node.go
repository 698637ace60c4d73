package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/raftps/raftps/shard/client"
)

// nodeUsage is the node command's synopsis.
const nodeUsage = `usage: raftps node drain|remove|activate NODE [flags]
  drain NODE     move every replica and leadership off NODE (--wait: until done)
  remove NODE    forget NODE for good; it must be stopped (drain it first)
  activate NODE  let a draining NODE hold replicas again`

func runNode(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, nodeUsage)
		return 2
	}
	verb := args[0]
	var admin client.NodeAdmin
	switch verb {
	case "drain":
		admin = client.NodeDraining
	case "remove":
		admin = client.NodeRemoved
	case "activate":
		admin = client.NodeActive
	case "-h", "--help", "help":
		fmt.Fprintln(stdout, nodeUsage)
		return 0
	default:
		fmt.Fprintf(stderr, "raftps node: unknown subcommand %q (want drain, remove or activate)\n", verb)
		return 2
	}
	fs := flag.NewFlagSet("raftps node "+verb+" NODE", flag.ContinueOnError)
	var cf clusterFlags
	cf.register(fs)
	timeout := fs.Duration("timeout", 10*time.Second, "how long to keep trying to reach the metadata leader")
	var wait *bool
	var waitFor *time.Duration
	if admin == client.NodeDraining {
		wait = fs.Bool("wait", false, "wait until NODE holds no replica and leads no shard, printing progress")
		waitFor = fs.Duration("wait-timeout", 30*time.Minute, "with --wait: how long to wait at most")
	}
	id, rest, rc := nameArg(fs, args[1:], "raftps node "+verb+" NODE [flags]", stderr)
	if rc >= 0 {
		return rc
	}
	if rc := parse(fs, rest, stderr); rc >= 0 {
		return rc
	}
	cmd := "node " + verb
	cl, err := cf.client()
	if err != nil {
		return fail(stderr, cmd, err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	err = cl.Admin().SetNodeAdmin(ctx, id, admin)
	cancel()
	if err != nil {
		return fail(stderr, cmd, nodeAdminError(id, err))
	}
	switch admin {
	case client.NodeDraining:
		if !*wait {
			fmt.Fprintf(stdout, "node %s is draining: its replicas and leaderships move to other nodes (watch with 'raftps status', or use --wait)\n", id)
			return 0
		}
		fmt.Fprintf(stderr, "node %s is draining; waiting until it holds no replica and leads no shard\n", id)
		if err := waitDrained(cl, cf.addrs(), id, *waitFor, stderr); err != nil {
			return fail(stderr, cmd, err)
		}
		fmt.Fprintf(stdout, "node %s is drained: it holds no replica and leads no shard; stop it, then 'raftps node remove %s'\n", id, id)
	case client.NodeRemoved:
		fmt.Fprintf(stdout, "node %s is removed: its replicas are placed on other nodes, and it may not rejoin under this ID\n", id)
	case client.NodeActive:
		fmt.Fprintf(stdout, "node %s is active: it may hold replicas again\n", id)
	}
	return 0
}

// nodeAdminError says plainly that a node is unknown; the server's other
// refusals explain themselves.
func nodeAdminError(id string, err error) error {
	if errors.Is(err, client.ErrUnknownNode) {
		return fmt.Errorf("no node %q in the cluster map (see 'raftps status'): %w", id, err)
	}
	return err
}

// drainProgress is what is left on a draining node.
type drainProgress struct {
	replicas int  // shards whose replicas include the node, or that are adding it
	leaders  int  // shard groups it leads, -1 if unknown
	known    bool // the map has the node
}

func (p drainProgress) done() bool { return p.known && p.replicas == 0 && p.leaders == 0 }

// waitDrained polls the cluster map and the node's status until the node
// holds no replica and leads nothing, printing progress every few seconds.
func waitDrained(cl *client.Client, addrs []string, id string, timeout time.Duration, stderr io.Writer) error {
	deadline := time.Now().Add(timeout)
	next := time.Now().Add(3 * time.Second)
	var last drainProgress
	var lastErr error
	for {
		p, err := drainState(cl, addrs, id)
		if err == nil && p.done() {
			return nil
		}
		if err == nil {
			last, lastErr = p, nil
		} else {
			lastErr = err
		}
		if time.Now().After(deadline) {
			if lastErr != nil {
				return fmt.Errorf("node %s not drained after %s: %w", id, timeout, lastErr)
			}
			return fmt.Errorf("node %s not drained after %s: %s", id, timeout, last)
		}
		if time.Now().After(next) {
			if lastErr != nil {
				fmt.Fprintf(stderr, "  %s: %v\n", id, lastErr)
			} else {
				fmt.Fprintf(stderr, "  %s: %s\n", id, last)
			}
			next = time.Now().Add(3 * time.Second)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func (p drainProgress) String() string {
	leaders := fmt.Sprint(p.leaders)
	if p.leaders < 0 {
		leaders = "unknown"
	}
	return fmt.Sprintf("%d replicas left, leads %s shards", p.replicas, leaders)
}

// drainState counts the node's replicas in the metadata leader's map and
// the shard groups it leads: as it says itself, else as the nodes that
// answer see it by gossip.
func drainState(cl *client.Client, addrs []string, id string) (drainProgress, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	cm, err := cl.Admin().ClusterMap(ctx)
	if err != nil {
		return drainProgress{}, err
	}
	p := drainProgress{leaders: -1}
	nd, known := cm.Node(id)
	p.known = known
	if !p.known {
		return p, fmt.Errorf("node %s is not in the cluster map any more", id)
	}
	for _, sm := range cm.Shards {
		if slices.Contains(sm.Replicas, id) || sm.Adding == id {
			p.replicas++
		}
	}
	ask := append([]string{nd.Addr}, addrs...)
	for _, a := range ask {
		st, err := cl.Admin().NodeStatus(ctx, a, false)
		if err != nil {
			continue
		}
		for _, o := range st.Nodes {
			if o.ID == id {
				p.leaders = o.Leaders
			}
		}
		if p.leaders >= 0 {
			break
		}
	}
	return p, nil
}
