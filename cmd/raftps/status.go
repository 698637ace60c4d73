package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/raftps/raftps/shard/client"
)

func runStatus(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("raftps status", flag.ContinueOnError)
	var cf clusterFlags
	cf.register(fs)
	timeout := fs.Duration("timeout", 3*time.Second, "how long to wait for each node")
	checksums := fs.Bool("checksums", false, "ask every replica for the checksum of its rows (costs a pass over each table)")
	showHot := fs.Bool("hot", false, "after the rest, print the hot keys of every table shard and their read replicas (--json always has them)")
	if rc := parse(fs, args, stderr); rc >= 0 {
		return rc
	}
	cl, err := cf.client()
	if err != nil {
		return fail(stderr, "status", err)
	}
	defer cl.Close()
	st, err := cl.Admin().ClusterStatus(context.Background(), client.StatusOptions{Checksums: *checksums, Timeout: *timeout})
	if err != nil {
		return fail(stderr, "status", err)
	}
	if cf.json {
		_ = printJSON(stdout, st)
		return 0
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tADDR\tSTATE\tADMIN\tREPLICAS\tLEADERS\tRPC")
	for _, n := range st.Nodes {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%s\n", n.ID, n.Addr, n.State, cmp.Or(n.Admin, "?"), n.Replicas, n.Leaders, n.RPC)
	}
	fmt.Fprintf(tw, "cluster map version: %d\n", st.MapVersion)
	fmt.Fprintf(tw, "under-replicated shards: %d\n", st.UnderReplicated)
	fmt.Fprintf(tw, "moving shards: %d\n", len(st.Moving))
	for _, m := range st.Moving {
		fmt.Fprintf(tw, "  %s/%d adding %s (replicas %s)\n", m.Table, m.Shard, m.Adding, strings.Join(m.Replicas, ","))
	}
	for _, n := range st.Nodes {
		if n.Disk != nil && n.Disk.Full {
			fmt.Fprintf(tw, "DISK FULL on %s: pushes refused: %s\n", n.ID, n.Disk.Reason)
		}
	}
	if len(st.SetAside) > 0 {
		fmt.Fprintf(tw, "set-aside replicas (corrupt files, moved away and rebuilt from peers): %d\n", len(st.SetAside))
		for _, a := range st.SetAside {
			state := "waiting for its removal from the shard"
			if a.Reopened {
				state = "removed from its shard: a new replica is rebuilt from peers (there or elsewhere)"
			}
			fmt.Fprintf(tw, "  %s on %s at %s: %s; files in %s; %s\n", a.Group, a.Node, a.At.UTC().Format(time.RFC3339), a.Reason, a.MovedTo, state)
		}
	}
	if len(st.Served) > 0 {
		fmt.Fprintln(tw, "\nNODE\tPULLS AS LEADER\tAS FOLLOWER\tAS READ-REPLICA\tROWS\tREFUSED")
		for _, s := range st.ServedByNode() {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\n", s.Node, s.AsLeader, s.AsFollower, s.AsReadReplica, s.Rows, s.Refused)
		}
	}
	sumHead := ""
	if *checksums {
		sumHead = "\tCHECKSUM"
	}
	fmt.Fprintln(tw, "\nGROUP\tNODE\tSTATE\tLEADER\tTERM\tAPPLIED\tCOMMIT\tLAST\tROWS"+sumHead)
	for _, r := range st.Replicas {
		state := r.State
		if r.Replication == "chain" {
			state = "chain " + r.ChainRole // TERM is the chain's epoch, LEADER its head
		}
		switch {
		case r.Dormant:
			state += " (dormant)"
		case r.Quiet:
			state += " (quiet)"
		}
		sum := ""
		if *checksums {
			sum = "\t-"
			if r.Checksum != nil {
				sum = fmt.Sprintf("\t%016x", *r.Checksum)
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d%s\n", r.Group, r.Node, state, r.Leader, r.Term, r.Applied, r.Commit, r.Last, r.Rows, sum)
	}
	if chains := st.Chains(); len(chains) > 0 {
		fmt.Fprintln(tw, "\nCHAIN\tEPOCH\tORDER (head → tail)")
		for _, c := range chains {
			fmt.Fprintf(tw, "%s\t%d\t%s\n", c.Group, c.ChainEpoch, strings.Join(c.ChainOrder, " → "))
		}
	}
	if len(st.Jobs) > 0 {
		fmt.Fprintln(tw, "\nJOB\tROUND\tRANKS")
		for _, j := range st.Jobs {
			fmt.Fprintf(tw, "%s\t%d\t%d/%d\n", j.Name, j.Round, j.Registered, j.World)
		}
	}
	tw.Flush()
	if *showHot {
		fmt.Fprintln(stdout)
		printHot(stdout, st.Hot)
	}
	return 0
}

// printHot prints the rows of hotRows as status --hot does.
func printHot(w io.Writer, rows []client.HotKeyRow) {
	if len(rows) == 0 {
		fmt.Fprintln(w, "no hot keys")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TABLE\tSHARD\tKEY\tRATE(pulls/s)\tREAD-REPLICAS")
	for _, r := range rows {
		ids := strings.Join(r.ReadReplicas, ",")
		if ids == "" {
			ids = "(none)"
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.1f\t%s\n", r.Table, r.Shard, r.Key, r.Rate, ids)
	}
	tw.Flush()
}
