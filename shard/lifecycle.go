package shard

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/raftps/raftps/shard/api"
	"github.com/raftps/raftps/shard/meta"
	"github.com/raftps/raftps/shard/shardpb"
)

// Dropping a table. The metadata leader applies CmdDropTable (refused while
// a job lists the table, unless forced), which removes the table's spec and
// its shards' map entries. Every node then, in its reconcile loop:
//
//   - closes its open replicas (Raft groups and chains) whose map entry is
//     gone, and deletes their directories, and deletes the directories of
//     replicas it had closed already (retired groups) whose entry is gone:
//     a shard entry is removed by a drop and nothing else;
//   - sweeps its data dir once after every start, and again whenever a
//     table leaves its map: every replica directory it has not opened is
//     checked against the cluster map as the metadata leader has it (not
//     its own, which may lag after a restart), and deleted if its table is
//     gone, or if it belongs to an older table of the same name. That is
//     how a node that was down during a drop cleans up.
//
// A replica directory records its table's incarnation (the metadata log
// index of the table's creation, shardpb.ShardMap.incarnation) in
// INCARNATION. A replica is opened only in a directory of its own
// incarnation: one of an older table of the same name is deleted first, so
// a table dropped and created again starts empty on every node, whatever
// the node missed while it was down.

// Default quotas. Every shard replica is a Raft group (or chain) with its
// own goroutines, bolt file and heartbeats, and every table and job lives in
// every node's memory and in each metadata snapshot: the defaults leave
// room for real use and stop a script in a loop long before a node suffers.
const (
	DefaultMaxTables          = 1024
	DefaultMaxReplicasPerNode = 2048
	DefaultMaxJobs            = 1024
)

// incarnationFile is a replica directory's record of its table's creation.
const incarnationFile = "INCARNATION"

func (s *service) DropTable(ctx context.Context, req *shardpb.DropTableRequest) (*shardpb.DropTableResponse, error) {
	if err := api.CheckTableName(req.Name); err != nil {
		return nil, s.n.toStatus(err)
	}
	return onMetaLeader(ctx, s.n, func() (*shardpb.DropTableResponse, error) { return s.n.dropTable(req) },
		&shardpb.ForwardRequest{Call: &shardpb.ForwardRequest_DropTable{DropTable: req}}, (*shardpb.ForwardResponse).GetDropTable)
}

// dropTable drops a table, on the metadata leader. It answers once the drop
// is committed; the nodes delete their replicas within a reconcile round.
func (n *Node) dropTable(req *shardpb.DropTableRequest) (*shardpb.DropTableResponse, error) {
	if err := n.metaAuthoritative(); err != nil {
		return nil, fmt.Errorf("dropping table %q: %w: %v", req.Name, api.ErrUnavailable, err)
	}
	if n.metaFSM.Table(req.Name) == nil {
		return nil, fmt.Errorf("table %q: %w", req.Name, api.ErrUnknownTable)
	}
	if _, err := n.applyMeta(meta.CmdDropTable, req, fmt.Sprintf("dropping table %q", req.Name)); err != nil {
		return nil, err
	}
	n.log.Info("table dropped", "table", req.Name, "force", req.Force)
	return &shardpb.DropTableResponse{}, nil
}

// prepareReplicaDir makes dir ready for a replica of incarnation inc: a
// directory of another incarnation (an older table of the same name) is
// deleted first. A directory without a record (written before records
// existed) is taken as the table's own.
func (n *Node) prepareReplicaDir(dir string, inc uint64) error {
	delete(n.incarnations, dir)
	old, ok := readIncarnation(dir)
	if ok && old == inc {
		return nil
	}
	if ok {
		if err := n.removeReplicaDir(dir); err != nil {
			return fmt.Errorf("deleting a replica of a dropped table: %w", err)
		}
		n.log.Info("replica of a dropped table of the same name deleted", "dir", dir, "incarnation", old, "table_incarnation", inc)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return writeFileAtomic(dir, incarnationFile, []byte(strconv.FormatUint(inc, 10)+"\n"))
}

// readIncarnation returns the incarnation dir records; false if it records
// none (no directory, no file, or not a number).
func readIncarnation(dir string) (uint64, bool) {
	b, err := os.ReadFile(filepath.Join(dir, incarnationFile))
	if err != nil {
		return 0, false
	}
	v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	return v, err == nil
}

// removeReplicaDir deletes a replica directory and forgets what it
// recorded (recordedIncarnation): every deletion of one goes through here.
func (n *Node) removeReplicaDir(dir string) error {
	delete(n.incarnations, dir)
	return os.RemoveAll(dir)
}

// recordedIncarnation is readIncarnation(dir) for an open replica's
// directory, read once: an idle node with hundreds of replicas otherwise
// reads as many files every second.
func (n *Node) recordedIncarnation(dir string) (uint64, bool) {
	if v, ok := n.incarnations[dir]; ok {
		return v, true
	}
	v, ok := readIncarnation(dir)
	if ok {
		n.incarnations[dir] = v
	}
	return v, ok
}

// reconcileDropped closes and deletes this node's replicas of dropped
// tables (see the top of this file), and sweeps the data dir when due.
func (n *Node) reconcileDropped(cm *shardpb.ClusterMap) {
	inc := make(map[string]uint64, len(cm.Shards))
	for _, sm := range cm.Shards {
		inc[meta.ShardMapKey(sm)] = sm.Incarnation
	}
	tables := make(map[string]bool, len(cm.Tables))
	for _, t := range cm.Tables {
		tables[t.Name] = true
	}
	for name := range n.knownTables {
		if !tables[name] {
			n.sweepDue = true // a drop: nodes down meanwhile sweep at start
		}
	}
	n.knownTables = tables

	n.mu.RLock()
	var groups, chains []string
	for id := range n.groups {
		groups = append(groups, id)
	}
	for id := range n.chains {
		chains = append(chains, id)
	}
	n.mu.RUnlock()
	stale := func(id, dir string) bool {
		want, ok := inc[id]
		if !ok {
			return true
		}
		have, recorded := n.recordedIncarnation(dir)
		return recorded && have != want
	}
	for _, id := range groups {
		if dir := n.groupDir(id); stale(id, dir) {
			if err := n.closeGroup(id); err != nil {
				n.log.Warn("closing a replica of a dropped table", "group", id, "error", err)
			}
			n.deleteDropped(id, dir)
		}
	}
	for _, id := range chains {
		if dir := n.chainDir(id); stale(id, dir) {
			n.closeChain(id, false)
			n.deleteDropped(id, dir)
		}
	}
	for id := range n.retired {
		if _, ok := inc[id]; !ok {
			n.deleteDropped(id, n.groupDir(id))
		}
	}
	if n.sweepDue {
		n.sweepDropped()
	}
}

// deleteDropped deletes a replica directory of a dropped table, and the
// table's directory if that was its last shard here.
func (n *Node) deleteDropped(id, dir string) {
	if err := n.removeReplicaDir(dir); err != nil {
		n.log.Warn("deleting a replica of a dropped table", "group", id, "dir", dir, "error", err)
		return
	}
	os.Remove(filepath.Dir(dir)) // fails, harmlessly, unless empty
	delete(n.retired, id)
	delete(n.leftChains, id)
	n.log.Info("replica of a dropped table deleted", "group", id, "dir", dir)
}

// sweepDropped deletes every replica directory this node has not opened
// whose table the metadata leader's map no longer holds, or holds in a
// later incarnation. The leader's map, fetched after the directories are
// listed, is newer than any of them: a directory is made only for a shard
// of a map this node applied.
func (n *Node) sweepDropped() {
	type replicaDir struct {
		id, dir string
		table   string
		shard   uint32
		chain   bool
	}
	var dirs []replicaDir
	for _, kind := range []struct {
		root  string
		chain bool
	}{{filepath.Join(n.cfg.DataDir, "groups"), false}, {filepath.Join(n.cfg.DataDir, "chains"), true}} {
		for table, sh := range replicaDirs(kind.root) {
			id := api.GroupID(table, sh)
			dirs = append(dirs, replicaDir{id: id, dir: filepath.Join(kind.root, table, strconv.FormatUint(uint64(sh), 10)), table: table, shard: sh, chain: kind.chain})
		}
	}
	if len(dirs) == 0 {
		n.sweepDue = false
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	cm, err := onMetaLeader(ctx, n, n.authoritativeMap,
		&shardpb.ForwardRequest{Call: &shardpb.ForwardRequest_GetClusterMap{GetClusterMap: &shardpb.GetClusterMapRequest{}}}, (*shardpb.ForwardResponse).GetClusterMap)
	if err != nil {
		n.log.Debug("sweeping replicas of dropped tables: no answer from the metadata leader yet", "error", err)
		return
	}
	specs := map[string]*shardpb.TableSpec{}
	for _, t := range cm.Tables {
		specs[t.Name] = t
	}
	entries := map[string]*shardpb.ShardMap{}
	for _, sm := range cm.Shards {
		entries[meta.ShardMapKey(sm)] = sm
	}
	for _, d := range dirs {
		if (!d.chain && n.groupOpen(d.id)) || (d.chain && n.chainOpen(d.id)) {
			continue
		}
		spec, sm := specs[d.table], entries[d.id]
		have, recorded := readIncarnation(d.dir)
		switch {
		case spec == nil:
		case sm != nil && recorded && have != sm.Incarnation:
		case sm == nil && d.shard >= spec.Shards:
		default:
			continue
		}
		n.deleteDropped(d.id, d.dir)
	}
	n.sweepDue = false
}
