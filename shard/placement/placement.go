package placement

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/raftps/raftps/shard/api"

	"github.com/cespare/xxhash/v2"
)

// Table is what Place needs to know of a table.
type Table struct {
	Name     string
	Shards   int // number of shards, > 0
	Replicas int // replication factor, > 0
}

// Placement maps a table name to, for each of its shards, the ordered IDs of
// the nodes holding a replica. The first node is the preferred leader.
type Placement map[string][][]string

// Result is the outcome of Place.
type Result struct {
	Placement Placement
	// Short is the number of shards given fewer replicas than their table
	// asks for, because there are fewer live nodes than replicas. Each such
	// shard is on every node.
	Short int
	// MaxReplicas and MaxLeaders are the per-node bounds: no node holds
	// more than ceil(T/N) replicas, where T is the total number of replicas
	// placed, and none leads more than ceil(S/N)+1 shards, where S is the
	// total number of shards (ceil(S/N) when possible). The replica bound
	// always holds; the leader bound holds whenever every table has the same
	// replication factor, and is aimed at otherwise. With one replication
	// factor R ≤ N, T = S·R, within the cluster's bound ceil(S·R/N)+1.
	MaxReplicas, MaxLeaders int
}

// pgroup is one shard during placement.
type pgroup struct {
	base    uint64 // hash of (table, shard)
	want    int    // replicas to place: min(Replicas, N)
	members []int  // node indices, in order
	oldLead int    // node index of the current leader kept at slot 0, or -1
	lead    int    // node index of the chosen leader
}

// Place decides, for every shard of every table, which of the live nodes hold
// its replicas and which one should lead. It is a pure function: the result
// depends only on the set of nodes, the set of tables and current, not on
// the order in which they are given.
//
// Without a current placement, each shard ranks the nodes by rendezvous
// (highest random weight) hashing and takes the best-ranked nodes that are
// below the load bound. With a current placement (the map as it is now), every
// replica on a live node is kept as long as that node stays within the bound
// (a node over it keeps its leader slots first, then the replicas it ranks
// best for), so a node joining or leaving moves about 1/N of the replicas,
// the fewest that restore balance. Leaders are then chosen among each shard's
// replicas, keeping the current leader where the bound allows, and balanced
// by augmenting paths.
//
// It fails, wrapping api.ErrBadRequest, when there is no node, a node ID is empty
// or repeated, or a table has no name, a repeated name, or no shards or
// replicas. Entries of current for unknown tables, shards beyond a table's
// count, dead or repeated nodes are ignored.
func Place(nodes []string, tables []Table, current Placement) (Result, error) {
	if len(nodes) == 0 {
		return Result{}, fmt.Errorf("%w: placement needs at least one node", api.ErrBadRequest)
	}
	ids := slices.Clone(nodes)
	slices.Sort(ids)
	for i, id := range ids {
		if id == "" {
			return Result{}, fmt.Errorf("%w: empty node ID", api.ErrBadRequest)
		}
		if i > 0 && ids[i-1] == id {
			return Result{}, fmt.Errorf("%w: node ID %q given twice", api.ErrBadRequest, id)
		}
	}
	ts := slices.Clone(tables)
	slices.SortFunc(ts, func(a, b Table) int { return cmp.Compare(a.Name, b.Name) })
	for i, t := range ts {
		switch {
		case t.Name == "":
			return Result{}, fmt.Errorf("%w: table with no name", api.ErrBadRequest)
		case i > 0 && ts[i-1].Name == t.Name:
			return Result{}, fmt.Errorf("%w: table %q given twice", api.ErrBadRequest, t.Name)
		case t.Shards <= 0:
			return Result{}, fmt.Errorf("%w: table %q has %d shards", api.ErrBadRequest, t.Name, t.Shards)
		case t.Replicas <= 0:
			return Result{}, fmt.Errorf("%w: table %q has %d replicas", api.ErrBadRequest, t.Name, t.Replicas)
		}
	}

	n := len(ids)
	index := make(map[string]int, n)
	nodeHash := make([]uint64, n)
	for i, id := range ids {
		index[id] = i
		nodeHash[i] = xxhash.Sum64String(id)
	}
	score := func(g *pgroup, node int) uint64 { return api.Mix64(g.base ^ nodeHash[node]) }
	// better reports whether node a ranks above node b for g.
	better := func(g *pgroup, a, b int) bool {
		sa, sb := score(g, a), score(g, b)
		if sa != sb {
			return sa > sb
		}
		return a < b
	}

	var groups []pgroup
	total, short := 0, 0
	for _, t := range ts {
		want := min(t.Replicas, n)
		if want < t.Replicas {
			short += t.Shards
		}
		for s := range t.Shards {
			groups = append(groups, pgroup{base: groupHash(t.Name, s), want: want, oldLead: -1})
			total += want
		}
	}
	capR := ceilDiv(total, n)
	capL := ceilDiv(len(groups), n) + 1
	load := make([]int, n)

	// Keep the current replicas on live nodes, up to capR per node.
	type keep struct{ g, slot int }
	kept := make([][]keep, n)
	start := 0
	for _, t := range ts {
		cur := current[t.Name]
		for s := 0; s < t.Shards && s < len(cur); s++ {
			gi := start + s
			var seen []int
			for _, id := range cur[s] {
				node, ok := index[id]
				if !ok || slices.Contains(seen, node) || len(seen) == groups[gi].want {
					continue
				}
				kept[node] = append(kept[node], keep{gi, len(seen)})
				seen = append(seen, node)
			}
		}
		start += t.Shards
	}
	slots := make([][]keep, len(groups)) // per group: (node, slot) kept
	for node, ks := range kept {
		slices.SortFunc(ks, func(a, b keep) int {
			if a.slot != b.slot {
				return cmp.Compare(a.slot, b.slot)
			}
			sa, sb := score(&groups[a.g], node), score(&groups[b.g], node)
			if sa != sb {
				return cmp.Compare(sb, sa)
			}
			return cmp.Compare(a.g, b.g)
		})
		for _, k := range ks[:min(len(ks), capR)] {
			slots[k.g] = append(slots[k.g], keep{node, k.slot})
			load[node]++
		}
	}
	for gi := range groups {
		g := &groups[gi]
		slices.SortFunc(slots[gi], func(a, b keep) int { return cmp.Compare(a.slot, b.slot) })
		for _, k := range slots[gi] {
			g.members = append(g.members, k.g)
			if k.slot == 0 {
				g.oldLead = k.g
			}
		}
	}

	// Fill the missing replicas by rendezvous rank among nodes below capR;
	// if too few are, take the least loaded and correct below.
	for gi := range groups {
		g := &groups[gi]
		for len(g.members) < g.want {
			best, least := -1, -1
			for node := range n {
				if slices.Contains(g.members, node) {
					continue
				}
				if load[node] < capR && (best < 0 || better(g, node, best)) {
					best = node
				}
				if least < 0 || load[node] < load[least] || load[node] == load[least] && better(g, node, least) {
					least = node
				}
			}
			if best < 0 {
				best = least
			}
			g.members = append(g.members, best)
			load[best]++
		}
	}

	// Bounded-load correction: move replicas off nodes above capR. A node z
	// above capR holds more replicas than any node x below it, so some shard
	// has z and not x; each move lowers the excess, so this ends.
	for {
		z := -1
		for node := range n {
			if load[node] > capR && (z < 0 || load[node] > load[z]) {
				z = node
			}
		}
		if z < 0 {
			break
		}
		moved := false
		for _, x := range byLoad(load) {
			if load[x] >= capR {
				break
			}
			bg, bpos := -1, -1
			for gi := range groups {
				g := &groups[gi]
				pos := slices.Index(g.members, z)
				if pos < 0 || slices.Contains(g.members, x) {
					continue
				}
				// Prefer a follower slot, then the shard ranking x best.
				switch {
				case bg < 0, pos > 0 && bpos == 0:
					bg, bpos = gi, pos
				case (pos > 0) == (bpos > 0) && score(g, x) > score(&groups[bg], x):
					bg, bpos = gi, pos
				}
			}
			if bg >= 0 {
				if groups[bg].oldLead == z {
					groups[bg].oldLead = -1
				}
				groups[bg].members[bpos] = x
				load[z]--
				load[x]++
				moved = true
				break
			}
		}
		if !moved {
			panic("placement: the correction found no move") // impossible, see above
		}
	}

	// Floor: a node below floor(T/N) (one that just joined) takes replicas
	// from the most loaded nodes above it, so it gets its share, not only
	// room for it. Each move narrows the spread; it ends.
	placed := 0
	for _, l := range load {
		placed += l
	}
	lo := placed / n
	for {
		order := byLoad(load)
		x, z := order[0], order[len(order)-1]
		if load[x] >= lo || load[z] <= lo {
			break
		}
		bg, bpos := -1, -1
		for _, zz := range slices.Backward(order) {
			if load[zz] <= lo {
				break
			}
			for gi := range groups {
				g := &groups[gi]
				pos := slices.Index(g.members, zz)
				if pos < 0 || slices.Contains(g.members, x) {
					continue
				}
				if bg < 0 || pos > 0 && bpos == 0 || (pos > 0) == (bpos > 0) && score(g, x) > score(&groups[bg], x) {
					bg, bpos, z = gi, pos, zz
				}
			}
			if bg >= 0 {
				break
			}
		}
		if bg < 0 {
			break
		}
		if groups[bg].oldLead == z {
			groups[bg].oldLead = -1
		}
		groups[bg].members[bpos] = x
		load[z]--
		load[x]++
	}

	// Leaders: the current one if kept and below capL, else the first
	// replica below capL. Then balance by augmenting paths, first to the
	// tight ceil(S/N), then to capL, which is always reachable when every
	// table has the same replication factor.
	lload := make([]int, n)
	for gi := range groups {
		g := &groups[gi]
		g.lead = -1
		if g.oldLead >= 0 && lload[g.oldLead] < capL {
			g.lead = g.oldLead
		}
		for _, m := range g.members {
			if g.lead < 0 && lload[m] < capL-1 {
				g.lead = m
			}
		}
		if g.lead < 0 {
			g.lead = g.members[0]
			for _, m := range g.members {
				if lload[m] < lload[g.lead] {
					g.lead = m
				}
			}
		}
		lload[g.lead]++
	}
	balanceLeaders(groups, lload, capL-1)
	balanceLeaders(groups, lload, capL)
	// And no node below floor(S/N) where its replicas allow: a node that
	// just joined takes its share of leaders, not only of replicas.
	raiseLeaders(groups, lload, len(groups)/n)

	out := make(Placement, len(ts))
	start = 0
	for _, t := range ts {
		shards := make([][]string, t.Shards)
		for s := range shards {
			g := &groups[start+s]
			list := make([]string, 0, len(g.members))
			list = append(list, ids[g.lead])
			for _, m := range g.members {
				if m != g.lead {
					list = append(list, ids[m])
				}
			}
			shards[s] = list
		}
		out[t.Name] = shards
		start += t.Shards
	}
	return Result{Placement: out, Short: short, MaxReplicas: capR, MaxLeaders: capL}, nil
}

// balanceLeaders moves leadership until no node leads more than c shards, or
// no augmenting path is left: from an overloaded node z, a breadth-first
// search over the shards each node leads to their other replicas finds a
// node below c, and leadership shifts one step along the path.
func balanceLeaders(groups []pgroup, lload []int, c int) {
	for changed := true; changed; {
		changed = false
		for z := range lload {
			for lload[z] > c && augmentLeader(groups, lload, c, z) {
				changed = true
			}
		}
	}
}

func augmentLeader(groups []pgroup, lload []int, c, z int) bool {
	n := len(lload)
	led := make([][]int, n)
	for gi := range groups {
		led[groups[gi].lead] = append(led[groups[gi].lead], gi)
	}
	via := make([]int, n) // group through which a node was reached
	for i := range via {
		via[i] = -1
	}
	seen := make([]bool, n)
	seen[z] = true
	queue := []int{z}
	for len(queue) > 0 {
		u := queue[0]
		queue = queue[1:]
		for _, gi := range led[u] {
			for _, m := range groups[gi].members {
				if seen[m] {
					continue
				}
				seen[m] = true
				via[m] = gi
				if lload[m] < c {
					for v := m; v != z; {
						g := &groups[via[v]]
						prev := g.lead
						g.lead = v
						v = prev
					}
					lload[m]++
					lload[z]--
					return true
				}
				queue = append(queue, m)
			}
		}
	}
	return false
}

// raiseLeaders moves leadership until every node leads at least lo shards,
// or no augmenting path is left: from an underloaded node u, a breadth-first
// search over the shards each node is a follower of, to their leaders, finds
// a node above lo, and leadership shifts one step along the path towards u.
func raiseLeaders(groups []pgroup, lload []int, lo int) {
	for changed := true; changed; {
		changed = false
		for u := range lload {
			for lload[u] < lo && pullLeader(groups, lload, lo, u) {
				changed = true
			}
		}
	}
}

func pullLeader(groups []pgroup, lload []int, lo, u int) bool {
	n := len(lload)
	follows := make([][]int, n) // groups a node is a non-leading member of
	for gi := range groups {
		for _, m := range groups[gi].members {
			if m != groups[gi].lead {
				follows[m] = append(follows[m], gi)
			}
		}
	}
	via := make([]int, n)    // group whose leader a node is, through which it was reached
	parent := make([]int, n) // the follower of that group the search came from
	seen := make([]bool, n)
	seen[u] = true
	queue := []int{u}
	for len(queue) > 0 {
		x := queue[0]
		queue = queue[1:]
		for _, gi := range follows[x] {
			w := groups[gi].lead
			if seen[w] {
				continue
			}
			seen[w], via[w], parent[w] = true, gi, x
			if lload[w] > lo {
				for v := w; v != u; v = parent[v] {
					groups[via[v]].lead = parent[v]
				}
				lload[w]--
				lload[u]++
				return true
			}
			queue = append(queue, w)
		}
	}
	return false
}

// Moves counts what changes from one placement to another: replicas
// in to that from does not have for the same shard (each one a copy to make),
// and shards whose preferred leader differs.
func Moves(from, to Placement) (replicas, leaders int) {
	for name, shards := range to {
		old := from[name]
		for s, list := range shards {
			var prev []string
			if s < len(old) {
				prev = old[s]
			}
			for _, id := range list {
				if !slices.Contains(prev, id) {
					replicas++
				}
			}
			if len(list) > 0 && (len(prev) == 0 || prev[0] != list[0]) {
				leaders++
			}
		}
	}
	return replicas, leaders
}

// byLoad returns the node indices by increasing load, ties by index.
func byLoad(load []int) []int {
	order := make([]int, len(load))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(load[a], load[b]) })
	return order
}

func groupHash(table string, shard int) uint64 {
	b := make([]byte, 0, len(table)+9)
	b = append(b, table...)
	b = append(b, 0)
	b = binary.LittleEndian.AppendUint64(b, uint64(shard))
	return xxhash.Sum64(b)
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }
