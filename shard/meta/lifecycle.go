package meta

import (
	"fmt"
	"slices"

	"github.com/raftps/raftps/shard/api"
	"github.com/raftps/raftps/shard/shardpb"
	"google.golang.org/protobuf/proto"
)

// Table lifecycle, quotas and the cluster's identity.
//
// Quotas are the proposing leader's (its node's flags), carried in the
// command and checked here against the state the command applies to: two
// creations decided at once cannot both slip under the limit, and every
// replica refuses alike. A command without them (0) has no limit, as
// entries written before quotas existed.

// MaxJobTables bounds the tables one job may list (JoinJobRequest.tables).
const MaxJobTables = 16

// MaxClusterIDLen bounds a cluster ID.
const MaxClusterIDLen = 64

// checkCreateQuotasLocked refuses a table creation that would exceed its
// quotas. m.mu must be held.
func (m *FSM) checkCreateQuotasLocked(c *shardpb.MetaCreateTable) error {
	if max := c.MaxTables; max > 0 && len(m.tables) >= int(max) {
		return fmt.Errorf("%w: table %q: the cluster holds %d tables, its limit of tables is %d; drop one or raise the limit", api.ErrQuotaExceeded, c.Spec.Name, len(m.tables), max)
	}
	max := c.MaxReplicasPerNode
	if max == 0 {
		return nil
	}
	count := map[string]int{}
	add := func(sm *shardpb.ShardMap) {
		for _, id := range sm.Replicas {
			count[id]++
		}
		if sm.Adding != "" {
			count[sm.Adding]++
		}
	}
	for _, sm := range m.shards {
		add(sm)
	}
	for _, sm := range c.Shards {
		add(sm)
	}
	// By ID, so that every replica's refusal names the same node.
	ids := make([]string, 0, len(count))
	for id := range count {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		if count[id] > int(max) {
			return fmt.Errorf("%w: table %q would place %d shard replicas on node %s, over its limit of %d replicas per node; add nodes, drop a table or raise the limit", api.ErrQuotaExceeded, c.Spec.Name, count[id], id, max)
		}
	}
	return nil
}

// CheckJobTables validates the tables a job lists.
func CheckJobTables(job string, tables []string) error {
	if len(tables) > MaxJobTables {
		return fmt.Errorf("%w: job %q lists %d tables, more than %d", api.ErrBadRequest, job, len(tables), MaxJobTables)
	}
	for _, t := range tables {
		if err := api.CheckTableName(t); err != nil {
			return fmt.Errorf("%w: job %q: %w", api.ErrBadRequest, job, err)
		}
	}
	return nil
}

func (m *FSM) applyJoinV2(arg []byte) any {
	c := &shardpb.MetaJoinJob{}
	if err := proto.Unmarshal(arg, c); err != nil {
		return fmt.Errorf("meta: decoding job join: %w", err)
	}
	if c.Join == nil {
		return fmt.Errorf("meta: %w: job join without a request", api.ErrBadRequest)
	}
	return m.applyJoinRequest(c.Join, c.MaxJobs)
}

// applyJoinRequest applies a join, refusing one that would add a job to a
// registry that holds maxJobs already (0: no limit).
func (m *FSM) applyJoinRequest(req *shardpb.JoinJobRequest, maxJobs uint32) any {
	if err := CheckJoinRequest(req); err != nil {
		return err
	}
	if err := CheckJobTables(req.Job, req.Tables); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	cur := m.jobs[req.Job]
	if cur == nil && maxJobs > 0 && len(m.jobs) >= int(maxJobs) {
		return fmt.Errorf("%w: job %q: the registry holds %d jobs, its limit of jobs is %d; delete a finished job or raise the limit", api.ErrQuotaExceeded, req.Job, len(m.jobs), maxJobs)
	}
	j, rank, err := joinJob(cur, req)
	if err != nil {
		return err
	}
	m.jobs[req.Job] = withTables(j, req.Tables)
	return &shardpb.JoinJobResponse{Rank: rank, Round: j.Round}
}

// withTables returns j listing tables (sorted, without repeats) instead of
// its own, if the join named any; j itself when nothing changes. Stored jobs
// are never modified, so a change is a copy.
func withTables(j *shardpb.Job, tables []string) *shardpb.Job {
	if len(tables) == 0 {
		return j
	}
	ts := slices.Compact(slices.Sorted(slices.Values(tables)))
	if slices.Equal(ts, j.Tables) {
		return j
	}
	return &shardpb.Job{Name: j.Name, World: j.World, Round: j.Round, Members: j.Members, Tables: ts}
}

// applyDrop removes a table's spec and its shards' map entries, refusing
// (ErrTableInUse) while a job lists it unless the request forces it. Nodes
// close and delete their replicas when their reconcile loop sees the map
// without them.
func (m *FSM) applyDrop(arg []byte) any {
	req := &shardpb.DropTableRequest{}
	if err := proto.Unmarshal(arg, req); err != nil {
		return fmt.Errorf("meta: decoding table drop: %w", err)
	}
	m.mu.Lock()
	spec, ok := m.tables[req.Name]
	if !ok {
		m.mu.Unlock()
		return fmt.Errorf("table %q: %w", req.Name, api.ErrUnknownTable)
	}
	if !req.Force {
		if j := m.jobUsingLocked(req.Name); j != nil {
			m.mu.Unlock()
			return fmt.Errorf("%w: table %q is listed by job %q (round %d, %d of %d trainers registered); delete the job or drop with force", api.ErrTableInUse, req.Name, j.Name, j.Round, len(j.Members), j.World)
		}
	}
	delete(m.tables, req.Name)
	for key, sm := range m.shards {
		if sm.Table == req.Name {
			delete(m.shards, key)
		}
	}
	m.changed()
	m.mu.Unlock()
	m.onChange()
	return spec
}

// jobUsingLocked returns the first job, by name, that lists table, or nil.
// m.mu must be held.
func (m *FSM) jobUsingLocked(table string) *shardpb.Job {
	for _, j := range sortedByName(m.jobs) {
		if slices.Contains(j.Tables, table) {
			return j
		}
	}
	return nil
}

// JobUsing returns the first job, by name, that lists table, or nil.
func (m *FSM) JobUsing(table string) *shardpb.Job {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.jobUsingLocked(table)
}

// applySetClusterID sets the cluster's ID if it has none; either way it
// answers the ID the cluster has afterwards (a string).
func (m *FSM) applySetClusterID(arg []byte) any {
	c := &shardpb.MetaClusterID{}
	if err := proto.Unmarshal(arg, c); err != nil {
		return fmt.Errorf("meta: decoding cluster ID: %w", err)
	}
	if c.Id == "" || len(c.Id) > MaxClusterIDLen {
		return fmt.Errorf("%w: cluster ID of %d bytes (want 1 to %d)", api.ErrBadRequest, len(c.Id), MaxClusterIDLen)
	}
	m.mu.Lock()
	if m.clusterID != "" {
		id := m.clusterID
		m.mu.Unlock()
		return id
	}
	m.clusterID = c.Id
	m.mu.Unlock()
	m.onChange()
	return c.Id
}

// ClusterID returns the cluster's ID, "" until the metadata group chose one.
func (m *FSM) ClusterID() string {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.clusterID
}
