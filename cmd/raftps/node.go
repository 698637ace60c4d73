package main

import (
	"context"
	"flag"
	"fmt"
	"io"
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
		return fail(stderr, cmd, err)
	}
	switch admin {
	case client.NodeDraining:
		if !*wait {
			fmt.Fprintf(stdout, "node %s is draining: its replicas and leaderships move to other nodes (watch with 'raftps status', or use --wait)\n", id)
			return 0
		}
		fmt.Fprintf(stderr, "node %s is draining; waiting until it holds no replica and leads no shard\n", id)
		if err := waitDrained(cl, id, *waitFor, stderr); err != nil {
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

// waitDrained waits until the node holds no replica and leads nothing,
// printing progress every few seconds.
func waitDrained(cl *client.Client, id string, timeout time.Duration, stderr io.Writer) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	next := time.Now().Add(3 * time.Second)
	return cl.Admin().WaitDrained(ctx, id, func(p client.DrainProgress, err error) {
		if time.Now().Before(next) {
			return
		}
		next = time.Now().Add(3 * time.Second)
		if err != nil {
			fmt.Fprintf(stderr, "  %s: %v\n", id, err)
		} else {
			fmt.Fprintf(stderr, "  %s: %s\n", id, p)
		}
	})
}
