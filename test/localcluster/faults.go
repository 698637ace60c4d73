package localcluster

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"
)

// Network faults for the nodes of a local cluster. They all talk over one
// host's loopback, where neither docker network disconnect nor a firewall
// rule can cut one node off, so each node's own /debug/netfault does it
// (the nodes must run with --fault-injection): a cut-off node blocks every
// other node's peer and gossip addresses, and every other node blocks its;
// clients still reach it. A slow node answers, and calls its peers, late.

// errNoFaults: the nodes cannot be told.
var errNoFaults = errors.New("this local cluster cannot be partitioned or slowed: its nodes were not started with --fault-injection (a test build's raftps cluster up --server-args --fault-injection: make build-faults)")

// CanInjectFaults reports whether every node runs with --fault-injection.
func (c *Cluster) CanInjectFaults() bool {
	for _, nd := range c.Nodes {
		if !slices.ContainsFunc(nd.Args, func(a string) bool { return a == "--fault-injection" || a == "--fault-injection=true" }) {
			return false
		}
	}
	return len(c.Nodes) > 0
}

// Isolate cuts node id off from every other node. The cut-off set lives in
// this Cluster value: Reconnect it through the same value.
func (c *Cluster) Isolate(id string) error {
	if _, err := c.Node(id); err != nil {
		return err
	}
	if !c.CanInjectFaults() {
		return errNoFaults
	}
	c.faultMu.Lock()
	defer c.faultMu.Unlock()
	if c.isolated == nil {
		c.isolated = map[string]bool{}
	}
	c.isolated[id] = true
	return c.applyLocked()
}

// Reconnect undoes Isolate.
func (c *Cluster) Reconnect(id string) error {
	c.faultMu.Lock()
	defer c.faultMu.Unlock()
	if !c.isolated[id] {
		return nil
	}
	delete(c.isolated, id)
	return c.applyLocked()
}

// applyLocked tells every node which peers to block: an isolated node all
// others, every other node the isolated ones. A node that does not answer
// (killed, paused) is skipped: it starts with nothing blocked, and the next
// change reaches it.
func (c *Cluster) applyLocked() error {
	var errs []error
	reached := 0
	for _, nd := range c.Nodes {
		var block []string
		for _, o := range c.Nodes {
			if o.ID != nd.ID && (c.isolated[nd.ID] || c.isolated[o.ID]) {
				block = append(block, o.PeerAddr, o.gossipAddr())
			}
		}
		if err := postNetFault(nd.HTTP, url.Values{"block": {strings.Join(block, ",")}}); err != nil {
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

// Slow makes node id answer every call, and call its peers, d late; 0
// ends it.
func (c *Cluster) Slow(id string, d time.Duration) error {
	nd, err := c.Node(id)
	if err != nil {
		return err
	}
	if !c.CanInjectFaults() {
		return errNoFaults
	}
	return postNetFault(nd.HTTP, url.Values{"delay": {d.String()}})
}

// gossipAddr is a node's gossip address: its --gossip-addr, or the default
// next to its client address.
func (nd Node) gossipAddr() string {
	for i, a := range nd.Args {
		if a == "--gossip-addr" && i+1 < len(nd.Args) {
			return nd.Args[i+1]
		}
		if v, ok := strings.CutPrefix(a, "--gossip-addr="); ok {
			return v
		}
	}
	return nd.GossipAddr()
}

// postNetFault posts form to the /debug/netfault of the node whose HTTP
// address is httpAddr.
func postNetFault(httpAddr string, form url.Values) error {
	hc := http.Client{Timeout: time.Second}
	resp, err := hc.PostForm("http://"+httpAddr+"/debug/netfault", form)
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
