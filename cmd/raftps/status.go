package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/raftps/raftps/shard/shardpb"
)

type replicaJSON struct {
	Group   string `json:"group"`
	Node    string `json:"node"`
	State   string `json:"state"`
	Leader  string `json:"leader"`
	Term    uint64 `json:"term"`
	Applied uint64 `json:"applied_index"`
	Commit  uint64 `json:"commit_index"`
	Last    uint64 `json:"last_index"`
	Rows    uint64 `json:"rows"`
	Memory  uint64 `json:"memory_bytes"`
}

type jobJSON struct {
	Name       string `json:"name"`
	Round      uint64 `json:"round"`
	Registered int    `json:"registered"`
	World      uint32 `json:"world"`
}

type nodeJSON struct {
	ID    string `json:"id"`
	Addr  string `json:"addr"`
	State string `json:"state"` // "up", or "unreachable: ..."
}

func runStatus(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("raftps status", flag.ContinueOnError)
	var cf clusterFlags
	cf.register(fs)
	timeout := fs.Duration("timeout", 3*time.Second, "how long to wait for each node")
	if rc := parse(fs, args, stderr); rc >= 0 {
		return rc
	}
	cl, err := cf.client()
	if err != nil {
		return fail(stderr, "status", err)
	}
	defer cl.Close()
	// Ask the given nodes, and every peer any of them names.
	addrs := cf.addrs()
	seen := map[string]bool{}
	var nodes []nodeJSON
	var replicas []replicaJSON
	// Jobs as the metadata leader has them (the freshest view), else as the
	// first node that answered has them.
	var jobs []*shardpb.Job
	haveJobs := false
	for i := 0; i < len(addrs); i++ {
		addr := addrs[i]
		if seen[addr] {
			continue
		}
		seen[addr] = true
		ctx, cancel := context.WithTimeout(context.Background(), *timeout)
		st, err := cl.Status(ctx, addr)
		cancel()
		if err != nil {
			nodes = append(nodes, nodeJSON{Addr: addr, State: "unreachable: " + err.Error()})
			continue
		}
		nodes = append(nodes, nodeJSON{ID: st.NodeId, Addr: addr, State: "up"})
		for _, p := range st.Nodes {
			addrs = append(addrs, p.Addr)
		}
		metaLeader := false
		for _, r := range st.Replicas {
			replicas = append(replicas, replicaOf(st.NodeId, r))
			metaLeader = metaLeader || (r.Group == "meta" && r.State == "leader")
		}
		if metaLeader || !haveJobs {
			jobs, haveJobs = st.Jobs, true
		}
	}
	jobRows := []jobJSON{}
	for _, j := range jobs {
		jobRows = append(jobRows, jobJSON{Name: j.Name, Round: j.Round, Registered: len(j.Members), World: j.World})
	}
	slices.SortFunc(nodes, func(a, b nodeJSON) int { return strings.Compare(a.Addr, b.Addr) })
	slices.SortFunc(replicas, func(a, b replicaJSON) int {
		if c := strings.Compare(a.Group, b.Group); c != 0 {
			return c
		}
		return strings.Compare(a.Node, b.Node)
	})
	if cf.json {
		_ = printJSON(stdout, struct {
			Nodes    []nodeJSON    `json:"nodes"`
			Replicas []replicaJSON `json:"replicas"`
			Jobs     []jobJSON     `json:"jobs"`
		}{nodes, replicas, jobRows})
		return 0
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tADDR\tSTATE")
	for _, n := range nodes {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", n.ID, n.Addr, n.State)
	}
	fmt.Fprintln(tw, "\nGROUP\tNODE\tSTATE\tLEADER\tTERM\tAPPLIED\tCOMMIT\tLAST\tROWS")
	for _, r := range replicas {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\n", r.Group, r.Node, r.State, r.Leader, r.Term, r.Applied, r.Commit, r.Last, r.Rows)
	}
	if len(jobRows) > 0 {
		fmt.Fprintln(tw, "\nJOB\tROUND\tRANKS")
		for _, j := range jobRows {
			fmt.Fprintf(tw, "%s\t%d\t%d/%d\n", j.Name, j.Round, j.Registered, j.World)
		}
	}
	tw.Flush()
	return 0
}

func replicaOf(node string, r *shardpb.ReplicaStatus) replicaJSON {
	return replicaJSON{Group: r.Group, Node: node, State: r.State, Leader: r.LeaderId, Term: r.Term,
		Applied: r.AppliedIndex, Commit: r.CommitIndex, Last: r.LastIndex, Rows: r.Rows, Memory: r.MemoryBytes}
}
