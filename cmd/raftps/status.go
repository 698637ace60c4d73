package main

import (
	"cmp"
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
	// Replication is "raft" or "chain". For a chain replica State is
	// "leader" on the head (as for a Raft group, so tools read both alike),
	// Leader the head, Term the epoch, Commit what the replica knows the
	// tail applied, and ChainRole, ChainEpoch and ChainOrder (node IDs,
	// head first) its configuration.
	Replication string   `json:"replication"`
	ChainRole   string   `json:"chain_role,omitempty"`
	ChainEpoch  uint64   `json:"chain_epoch,omitempty"`
	ChainOrder  []string `json:"chain_order,omitempty"`
	// Checksum of the rows at Applied, with --checksums (replicas of one
	// shard at the same applied index must agree).
	Checksum *uint64 `json:"checksum,omitempty"`
}

type jobJSON struct {
	Name       string `json:"name"`
	Round      uint64 `json:"round"`
	Registered int    `json:"registered"`
	World      uint32 `json:"world"`
}

// nodeJSON is one node: its liveness by gossip and its admin state as the
// metadata leader (else the first node that answered) sees them, the shard
// replicas the cluster map places on it, the shard groups it leads, and
// whether this command reached it.
type nodeJSON struct {
	ID       string `json:"id"`
	Addr     string `json:"addr"`
	State    string `json:"state"` // "alive", "suspect" or "dead" by gossip; "unknown" if no node said
	Admin    string `json:"admin"` // "active", "draining", "removed" or "unregistered"; "" if no node said
	Replicas uint32 `json:"replicas"`
	Leaders  uint32 `json:"leaders"`
	RPC      string `json:"rpc"` // "up", or "unreachable: ..."
}

// movingJSON is a shard gaining a replica: Adding catches up as a
// non-voter, then becomes a voter.
type movingJSON struct {
	Table    string   `json:"table"`
	Shard    uint32   `json:"shard"`
	Replicas []string `json:"replicas"`
	Adding   string   `json:"adding"`
}

// hotJSON is one hot key of a table shard, as the shard's leader has it,
// and the read replicas (node IDs) that serve it besides the shard.
type hotJSON struct {
	Table        string   `json:"table"`
	Shard        uint32   `json:"shard"`
	Key          uint64   `json:"key"`
	Rate         float64  `json:"rate"` // pulls a second, all replicas together
	ReadReplicas []string `json:"read_replicas"`
}

// servedJSON counts the pulls one node served in one role at one level
// since it started, and those it refused as too stale.
type servedJSON struct {
	Node     string `json:"node"`
	Role     string `json:"role"`  // "leader", "follower" or "read-replica"
	Level    string `json:"level"` // "linearizable", "bounded" or "eventual"
	Requests uint64 `json:"requests"`
	Rows     uint64 `json:"rows"`
	Refused  uint64 `json:"refused"`
}

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
	// Ask the given nodes, and every peer any of them names.
	addrs := cf.addrs()
	seen := map[string]bool{}
	var replicas []replicaJSON
	// Jobs and the gossip view as the metadata leader has them (the
	// freshest view), else as the first node that answered has them.
	var view *shardpb.StatusResponse
	rpc := map[string]string{}             // by address
	self := map[string]*shardpb.NodeInfo{} // each answering node about itself
	var answers []*shardpb.StatusResponse
	served := []servedJSON{}
	for i := 0; i < len(addrs); i++ {
		addr := addrs[i]
		if seen[addr] {
			continue
		}
		seen[addr] = true
		ctx, cancel := context.WithTimeout(context.Background(), *timeout)
		st, err := cl.StatusWith(ctx, addr, &shardpb.StatusRequest{Checksums: *checksums})
		cancel()
		if err != nil {
			rpc[addr] = "unreachable: " + err.Error()
			continue
		}
		rpc[addr] = "up"
		answers = append(answers, st)
		for _, c := range st.Served {
			served = append(served, servedJSON{Node: st.NodeId, Role: c.Role, Level: c.Level, Requests: c.Requests, Rows: c.Rows, Refused: c.Refused})
		}
		for _, p := range st.Nodes {
			if p.Id == st.NodeId {
				self[p.Id] = p
			}
			if p.Addr != "" {
				addrs = append(addrs, p.Addr)
			}
		}
		metaLeader := false
		for _, r := range st.Replicas {
			replicas = append(replicas, replicaOf(st.NodeId, r))
			metaLeader = metaLeader || (r.Group == "meta" && r.State == "leader")
		}
		if metaLeader || view == nil {
			view = st
		}
	}
	var nodes []nodeJSON
	var jobs []*shardpb.Job
	underReplicated := uint32(0)
	var mapVersion uint64
	moving := []movingJSON{}
	if view != nil {
		jobs, underReplicated, mapVersion = view.Jobs, view.UnderReplicated, view.MapVersion
		for _, sm := range view.Moving {
			moving = append(moving, movingJSON{Table: sm.Table, Shard: sm.Shard, Replicas: sm.Replicas, Adding: sm.Adding})
		}
		for _, p := range view.Nodes {
			// Replicas come from the viewing node's map (the metadata
			// leader's is the freshest); leaders from each node about
			// itself, else as it last gossiped.
			nd := nodeJSON{ID: p.Id, Addr: p.Addr, State: p.State, Admin: p.Admin, Replicas: p.Replicas, Leaders: p.Leaders, RPC: rpc[p.Addr]}
			if me := self[p.Id]; me != nil {
				nd.Leaders = me.Leaders
			}
			if nd.RPC == "" {
				nd.RPC = "not asked"
			}
			nodes = append(nodes, nd)
			delete(rpc, p.Addr)
		}
	}
	for addr, r := range rpc {
		nodes = append(nodes, nodeJSON{Addr: addr, State: "unknown", RPC: r})
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
	// Stable: each node's counters stay in the order it gave them.
	slices.SortStableFunc(served, func(a, b servedJSON) int { return strings.Compare(a.Node, b.Node) })
	hot := hotRows(answers)
	if cf.json {
		_ = printJSON(stdout, struct {
			Nodes           []nodeJSON    `json:"nodes"`
			MapVersion      uint64        `json:"map_version"`
			UnderReplicated uint32        `json:"under_replicated"`
			Moving          []movingJSON  `json:"moving"`
			Replicas        []replicaJSON `json:"replicas"`
			Jobs            []jobJSON     `json:"jobs"`
			Hot             []hotJSON     `json:"hot"`
			Served          []servedJSON  `json:"served"`
		}{nodes, mapVersion, underReplicated, moving, replicas, jobRows, hot, served})
		return 0
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tADDR\tSTATE\tADMIN\tREPLICAS\tLEADERS\tRPC")
	for _, n := range nodes {
		admin := n.Admin
		if admin == "" {
			admin = "?"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%s\n", n.ID, n.Addr, n.State, admin, n.Replicas, n.Leaders, n.RPC)
	}
	fmt.Fprintf(tw, "cluster map version: %d\n", mapVersion)
	fmt.Fprintf(tw, "under-replicated shards: %d\n", underReplicated)
	fmt.Fprintf(tw, "moving shards: %d\n", len(moving))
	for _, m := range moving {
		fmt.Fprintf(tw, "  %s/%d adding %s (replicas %s)\n", m.Table, m.Shard, m.Adding, strings.Join(m.Replicas, ","))
	}
	if len(served) > 0 {
		fmt.Fprintln(tw, "\nNODE\tPULLS AS LEADER\tAS FOLLOWER\tAS READ-REPLICA\tROWS\tREFUSED")
		for _, s := range servedByNode(served) {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\n", s.node, s.requests[0], s.requests[1], s.requests[2], s.rows, s.refused)
		}
	}
	sumHead := ""
	if *checksums {
		sumHead = "\tCHECKSUM"
	}
	fmt.Fprintln(tw, "\nGROUP\tNODE\tSTATE\tLEADER\tTERM\tAPPLIED\tCOMMIT\tLAST\tROWS"+sumHead)
	for _, r := range replicas {
		state := r.State
		if r.Replication == "chain" {
			state = "chain " + r.ChainRole // TERM is the chain's epoch, LEADER its head
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
	if chains := chainRows(replicas); len(chains) > 0 {
		fmt.Fprintln(tw, "\nCHAIN\tEPOCH\tORDER (head → tail)")
		for _, c := range chains {
			fmt.Fprintf(tw, "%s\t%d\t%s\n", c.Group, c.ChainEpoch, strings.Join(c.ChainOrder, " → "))
		}
	}
	if len(jobRows) > 0 {
		fmt.Fprintln(tw, "\nJOB\tROUND\tRANKS")
		for _, j := range jobRows {
			fmt.Fprintf(tw, "%s\t%d\t%d/%d\n", j.Name, j.Round, j.Registered, j.World)
		}
	}
	tw.Flush()
	if *showHot {
		fmt.Fprintln(stdout)
		printHot(stdout, hot)
	}
	return 0
}

// hotRows flattens the hot sets the answering nodes report for the shards
// they lead into one row per key, by table, shard and rate (highest first).
// While leadership moves, a deposed leader that has not noticed yet may
// report a shard too: the answer of the node with the highest term of the
// shard's group wins, as it is the current leader's (or closer to it).
func hotRows(answers []*shardpb.StatusResponse) []hotJSON {
	type source struct {
		term uint64
		hs   *shardpb.HotShard
	}
	best := map[string]source{}
	for _, st := range answers {
		terms := map[string]uint64{}
		for _, r := range st.Replicas {
			terms[r.Group] = r.Term
		}
		for _, hs := range st.Hot {
			g := fmt.Sprintf("%s/%d", hs.Table, hs.Shard)
			cur, ok := best[g]
			if !ok || terms[g] > cur.term || (terms[g] == cur.term && hs.Version > cur.hs.Version) {
				best[g] = source{terms[g], hs}
			}
		}
	}
	rows := []hotJSON{}
	for _, src := range best {
		ids := src.hs.ReplicaIds
		if ids == nil {
			ids = []string{} // JSON [] rather than null: no read replicas yet
		}
		for _, k := range src.hs.Keys {
			rows = append(rows, hotJSON{Table: src.hs.Table, Shard: src.hs.Shard, Key: k.Key, Rate: k.Rate, ReadReplicas: ids})
		}
	}
	slices.SortFunc(rows, func(a, b hotJSON) int {
		return cmp.Or(strings.Compare(a.Table, b.Table), cmp.Compare(a.Shard, b.Shard), cmp.Compare(b.Rate, a.Rate), cmp.Compare(a.Key, b.Key))
	})
	return rows
}

// printHot prints the rows of hotRows as status --hot does.
func printHot(w io.Writer, rows []hotJSON) {
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

// nodeServed sums one node's served counters over the levels: requests by
// role (leader, follower, read-replica), rows and refusals over all.
type nodeServed struct {
	node          string
	requests      [3]uint64
	rows, refused uint64
}

// servedByNode sums served, which is sorted by node, into one row a node.
func servedByNode(served []servedJSON) []nodeServed {
	var out []nodeServed
	for _, s := range served {
		if len(out) == 0 || out[len(out)-1].node != s.Node {
			out = append(out, nodeServed{node: s.Node})
		}
		n := &out[len(out)-1]
		switch s.Role {
		case "leader":
			n.requests[0] += s.Requests
		case "follower":
			n.requests[1] += s.Requests
		case "read-replica":
			n.requests[2] += s.Requests
		}
		n.rows += s.Rows
		n.refused += s.Refused
	}
	return out
}

func replicaOf(node string, r *shardpb.ReplicaStatus) replicaJSON {
	out := replicaJSON{Group: r.Group, Node: node, State: r.State, Leader: r.LeaderId, Term: r.Term,
		Applied: r.AppliedIndex, Commit: r.CommitIndex, Last: r.LastIndex, Rows: r.Rows, Memory: r.MemoryBytes,
		Replication: cmp.Or(r.Replication, "raft"), ChainRole: r.ChainRole, ChainEpoch: r.ChainEpoch, ChainOrder: r.ChainOrder}
	if r.HasChecksum {
		sum := r.Checksum
		out.Checksum = &sum
	}
	return out
}

// chainRows picks, for each chain group, the replica with the newest
// configuration (highest epoch): the chain's order as far as its members
// know. replicas are sorted by group.
func chainRows(replicas []replicaJSON) []replicaJSON {
	var out []replicaJSON
	for _, r := range replicas {
		if r.Replication != "chain" {
			continue
		}
		if n := len(out); n > 0 && out[n-1].Group == r.Group {
			if r.ChainEpoch > out[n-1].ChainEpoch {
				out[n-1] = r
			}
			continue
		}
		out = append(out, r)
	}
	return out
}
