package meta

import (
	"encoding/binary"
	"fmt"
	"io"
	"maps"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/raftps/raftps/shard/api"

	"github.com/hashicorp/raft"
	"github.com/raftps/raftps/shard/shardpb"
	"github.com/raftps/raftps/store"
	"google.golang.org/protobuf/proto"
)

// Commands: a type byte, then the deterministic proto encoding of the
// argument (Encode). The values are in every metadata log: they never
// change.
const (
	// CmdCreateTable is the command of clusters before the cluster map:
	// the table gets no placement. Still applied, so that old logs replay.
	CmdCreateTable   byte = 1 // a *shardpb.TableSpec
	CmdJoinJob       byte = 2 // a *shardpb.JoinJobRequest
	CmdDeleteJob     byte = 3 // a *shardpb.DeleteJobRequest
	CmdCreateTableV2 byte = 4 // a *shardpb.MetaCreateTable
	CmdRegisterNode  byte = 5 // a *shardpb.ClusterNode
	CmdSetNodeAdmin  byte = 6 // a *shardpb.SetNodeAdminRequest
	CmdForgetNode    byte = 7 // a *shardpb.SetNodeAdminRequest (id only)
	CmdSetShard      byte = 8 // a *shardpb.MetaSetShard
	CmdAlterTable    byte = 9 // a *shardpb.TableSpec: the whole new spec
	// Table lifecycle, quotas and the cluster's identity (lifecycle.go).
	CmdDropTable    byte = 40 // a *shardpb.DropTableRequest
	CmdJoinJobV2    byte = 41 // a *shardpb.MetaJoinJob: a join with the jobs quota
	CmdSetClusterID byte = 42 // a *shardpb.MetaClusterID
)

var deterministic = proto.MarshalOptions{Deterministic: true}

// Encode makes the log entry of command cmd with argument arg, for the
// metadata group's leader to propose.
func Encode(cmd byte, arg proto.Message) ([]byte, error) {
	b, err := deterministic.Marshal(arg)
	if err != nil {
		return nil, fmt.Errorf("meta: encoding command %d: %w", cmd, err)
	}
	return append([]byte{cmd}, b...), nil
}

// FSM is the metadata group's state machine (a raft.FSM): the table specs
// and the trainer jobs, by name, and the cluster map.
//
// Concurrency: raft calls Apply, Snapshot, Restore and StoreConfiguration
// one at a time; readers (Table, List, Job, JobList, the cluster map's
// readers) take mu and may be called from any goroutine. onChange is called
// after every change of the tables or the map, from the FSM goroutine, and
// must not block; job changes do not call it, since only tables and the map
// concern the reconcile loop.
type FSM struct {
	mu     sync.RWMutex // guards tables, jobs and the cluster map
	tables map[string]*shardpb.TableSpec
	jobs   map[string]*shardpb.Job // values never modified: see jobs.go
	// The cluster map (clustermap.go). Values are never modified, only
	// replaced, so readers may keep them.
	nodes      map[string]*shardpb.ClusterNode // by node ID
	shards     map[string]*shardpb.ShardMap    // by api.GroupID
	mapVersion uint64                          // +1 on every map change
	clusterID  string                          // "" until CmdSetClusterID
	// evals: each job's evaluation curve (evals.go); values replaced,
	// never modified.
	evals map[string]*shardpb.JobEvals
	// tokens: bearer tokens' records by ID (tokens.go); values replaced,
	// never modified.
	tokens   map[string]*shardpb.MetaToken
	onChange func()
	// processed is the highest log index the FSM is known to have taken
	// in: the last command applied or configuration stored (both in log
	// order, by the FSM goroutine), or a barrier that completed. Every
	// entry up to it is reflected in the state. See the node's
	// metaReadIndex.
	processed atomic.Uint64
}

// Processed returns the highest log index the FSM is known to have taken
// in: every entry up to it is reflected in what the readers return.
func (m *FSM) Processed() uint64 { return m.processed.Load() }

// NoteProcessed raises Processed to ix: the node calls it when a barrier at
// ix completes, since everything before a barrier has been applied.
func (m *FSM) NoteProcessed(ix uint64) {
	for {
		cur := m.processed.Load()
		if ix <= cur || m.processed.CompareAndSwap(cur, ix) {
			return
		}
	}
}

// StoreConfiguration makes FSM a raft.ConfigurationStore, only so
// that processed counts configuration entries too: without it a
// configuration change as the newest committed entry would leave the
// node's metaReadIndex waiting for the next command.
func (m *FSM) StoreConfiguration(index uint64, _ raft.Configuration) {
	m.NoteProcessed(index)
}

// New returns an empty FSM that calls onChange after every change of the
// tables or the cluster map (see FSM).
func New(onChange func()) *FSM {
	return &FSM{
		tables: map[string]*shardpb.TableSpec{}, jobs: map[string]*shardpb.Job{},
		nodes: map[string]*shardpb.ClusterNode{}, shards: map[string]*shardpb.ShardMap{},
		onChange: onChange,
	}
}

// Apply returns, by command: the stored *shardpb.TableSpec, the joiner's
// *shardpb.JoinJobResponse, nil for a deleted job; or an error. An error
// changes nothing.
func (m *FSM) Apply(l *raft.Log) any {
	defer m.NoteProcessed(l.Index) // after the change is in place
	if l.Type != raft.LogCommand {
		return nil
	}
	if len(l.Data) == 0 {
		return fmt.Errorf("meta: %w: empty command", api.ErrBadRequest)
	}
	switch cmd, arg := l.Data[0], l.Data[1:]; cmd {
	case CmdCreateTable:
		return m.applyCreate(arg)
	case CmdJoinJob:
		return m.applyJoin(arg)
	case CmdDeleteJob:
		return m.applyDelete(arg)
	case CmdCreateTableV2:
		return m.applyCreateV2(arg, l.Index)
	case CmdRegisterNode:
		return m.applyRegister(arg)
	case CmdSetNodeAdmin:
		return m.applySetAdmin(arg)
	case CmdForgetNode:
		return m.applyForget(arg)
	case CmdSetShard:
		return m.applySetShard(arg)
	case CmdAlterTable:
		return m.applyAlter(arg)
	case CmdDropTable:
		return m.applyDrop(arg)
	case CmdJoinJobV2:
		return m.applyJoinV2(arg)
	case CmdSetClusterID:
		return m.applySetClusterID(arg)
	case CmdReportEval:
		return m.applyReportEval(arg)
	case CmdPutToken:
		return m.applyPutToken(arg)
	case CmdDeleteToken:
		return m.applyDeleteToken(arg)
	default:
		return fmt.Errorf("meta: %w: unknown command %d", api.ErrBadRequest, cmd)
	}
}

func (m *FSM) applyCreate(arg []byte) any {
	spec := &shardpb.TableSpec{}
	if err := proto.Unmarshal(arg, spec); err != nil {
		return fmt.Errorf("meta: decoding table spec: %w", err)
	}
	if err := checkStoredSpec(spec); err != nil {
		return err
	}
	m.mu.Lock()
	if _, ok := m.tables[spec.Name]; ok {
		m.mu.Unlock()
		return fmt.Errorf("table %q: %w", spec.Name, store.ErrTableExists)
	}
	m.tables[spec.Name] = spec
	m.changed()
	m.mu.Unlock()
	m.onChange()
	return spec
}

// applyAlter replaces a table's spec with one that differs only in what
// AlterTable may change: checked here, on the state it applies to, so an
// alter decided on a spec that changed meanwhile cannot slip through.
// checkStoredSpec refuses a table creation whose spec the rest of the node
// could not live with: no name, or a shard count or dimension that readers
// (TableShards, the reconcile loop) would size allocations by. The leader
// stored only normalized specs (api.NormalizeSpec), which all pass: this
// is the defensive check of a command decoded from the log, kept to what
// every spec ever stored meets, so that old logs replay unchanged.
func checkStoredSpec(spec *shardpb.TableSpec) error {
	switch {
	case spec.GetName() == "":
		return fmt.Errorf("meta: %w: table creation without a name", api.ErrBadRequest)
	case api.CheckTableName(spec.Name) != nil:
		// The leader checked the name (api.NormalizeSpec); checked again
		// so that no entry, of whatever origin, makes a table whose name
		// is a path with a meaning in every node's data dir.
		return api.CheckTableName(spec.Name)
	case spec.Shards == 0 || spec.Shards > api.MaxShards:
		return fmt.Errorf("meta: %w: table %q: %d shards (want 1..%d)", api.ErrInvalidConfig, spec.Name, spec.Shards, api.MaxShards)
	case spec.Dim == 0 || spec.Dim > store.MaxDim:
		return fmt.Errorf("meta: %w: table %q: dim %d (want 1..%d)", api.ErrInvalidConfig, spec.Name, spec.Dim, store.MaxDim)
	}
	return nil
}

func (m *FSM) applyAlter(arg []byte) any {
	spec := &shardpb.TableSpec{}
	if err := proto.Unmarshal(arg, spec); err != nil {
		return fmt.Errorf("meta: decoding table spec: %w", err)
	}
	if err := api.CheckLevel(spec); err != nil {
		return err
	}
	if err := api.CheckTableName(spec.Name); err != nil {
		return err
	}
	m.mu.Lock()
	old, ok := m.tables[spec.Name]
	if !ok {
		m.mu.Unlock()
		return fmt.Errorf("table %q: %w", spec.Name, store.ErrUnknownTable)
	}
	fixed := proto.Clone(spec).(*shardpb.TableSpec)
	fixed.Consistency, fixed.StalenessBoundNs, fixed.HotThreshold, fixed.HotReplicas = old.Consistency, old.StalenessBoundNs, old.HotThreshold, old.HotReplicas
	if !proto.Equal(fixed, old) {
		m.mu.Unlock()
		return fmt.Errorf("%w: table %q: only the consistency level, staleness bound and hot-key settings can be altered", store.ErrInvalidConfig, spec.Name)
	}
	m.tables[spec.Name] = spec
	m.changed()
	m.mu.Unlock()
	m.onChange()
	return spec
}

func (m *FSM) applyJoin(arg []byte) any {
	req := &shardpb.JoinJobRequest{}
	if err := proto.Unmarshal(arg, req); err != nil {
		return fmt.Errorf("meta: decoding job join: %w", err)
	}
	return m.applyJoinRequest(req, 0)
}

func (m *FSM) applyDelete(arg []byte) any {
	req := &shardpb.DeleteJobRequest{}
	if err := proto.Unmarshal(arg, req); err != nil {
		return fmt.Errorf("meta: decoding job deletion: %w", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.jobs[req.Job]; !ok {
		return fmt.Errorf("job %q: %w", req.Job, api.ErrUnknownJob)
	}
	delete(m.jobs, req.Job)
	delete(m.evals, req.Job)
	return nil
}

// Job returns the named job (not to be modified) or nil.
func (m *FSM) Job(name string) *shardpb.Job {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.jobs[name]
}

// JobList returns the jobs sorted by name.
func (m *FSM) JobList() []*shardpb.Job {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return sortedByName(m.jobs)
}

// sortedByName returns byName's values in the order of their names, which
// every map of the FSM has for keys. Sorting the keys, not names computed
// per comparison, matters: a shard's name is a fmt.Sprintf, and the node
// reads the whole map every second (an idle 256-group cluster spent 5 % of
// its CPU formatting shard names).
func sortedByName[V any](byName map[string]V) []V {
	names := slices.Sorted(maps.Keys(byName))
	out := make([]V, len(names))
	for i, name := range names {
		out[i] = byName[name]
	}
	return out
}

// Table returns the named spec (not to be modified) or nil.
func (m *FSM) Table(name string) *shardpb.TableSpec {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.tables[name]
}

// List returns the specs sorted by name.
func (m *FSM) List() []*shardpb.TableSpec {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return sortedByName(m.tables)
}

// Snapshot formats. Format 1, written before the job registry existed: the
// table count u32, then per table in name order its length u32 and spec.
// Format 2: snapshotMarker u32, the format u32, then a
// shardpb.MetaSnapshot with tables and jobs; format 3 is the same with the
// cluster map too (and, when chosen, the cluster ID). Restore reads all
// three. The marker cannot begin a format 1 snapshot: 2^32-1 tables of at
// least 4 bytes each would be a 16 GiB metadata state.
//
// Restore reads a snapshot whole, whatever its size. It used to stop at
// 256 MiB, silently: a larger state then failed to decode (or, cut at a
// field boundary, decoded as a smaller one), and the node could neither
// restart nor catch up. The state a snapshot holds is already in every
// node's memory, so reading it costs no more than holding it; what bounds
// it is the quotas on tables, shards and jobs (MetaCreateTable,
// MetaJoinJob) and the limits on names, addresses and job fields.
const (
	snapshotMarker = 0xFFFFFFFF
	snapshotFormat = 3
)

// Snapshot writes format 3. The tables and jobs are taken under one lock, so
// they are of the same applied index.
func (m *FSM) Snapshot() (raft.FSMSnapshot, error) {
	m.mu.RLock()
	state := &shardpb.MetaSnapshot{
		Tables:     sortedByName(m.tables),
		Jobs:       sortedByName(m.jobs),
		Nodes:      sortedByName(m.nodes),
		Shards:     sortedByName(m.shards),
		MapVersion: m.mapVersion,
		ClusterId:  m.clusterID,
		Evals:      sortedByName(m.evals),
		Tokens:     sortedByName(m.tokens),
	}
	m.mu.RUnlock()
	b := binary.LittleEndian.AppendUint32(nil, snapshotMarker)
	b = binary.LittleEndian.AppendUint32(b, snapshotFormat)
	b, err := deterministic.MarshalAppend(b, state)
	if err != nil {
		return nil, fmt.Errorf("meta: encoding snapshot: %w", err)
	}
	return fsmSnapshot(b), nil
}

type fsmSnapshot []byte

func (s fsmSnapshot) Persist(sink raft.SnapshotSink) error {
	if _, err := sink.Write(s); err != nil {
		_ = sink.Cancel()
		return fmt.Errorf("meta: persisting snapshot: %w", err)
	}
	return sink.Close()
}

func (fsmSnapshot) Release() {}

func (m *FSM) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		return fmt.Errorf("meta: reading snapshot: %w", err)
	}
	var tables map[string]*shardpb.TableSpec
	jobs := map[string]*shardpb.Job{}
	nodes := map[string]*shardpb.ClusterNode{}
	shards := map[string]*shardpb.ShardMap{}
	var version uint64
	var clusterID string
	var evals map[string]*shardpb.JobEvals
	var tokens map[string]*shardpb.MetaToken
	if len(b) >= 4 && binary.LittleEndian.Uint32(b) == snapshotMarker {
		if len(b) < 8 {
			return fmt.Errorf("meta: %w: snapshot header truncated", store.ErrCorruptSnapshot)
		}
		if f := binary.LittleEndian.Uint32(b[4:]); f != 2 && f != snapshotFormat {
			return fmt.Errorf("meta: %w: snapshot format %d, this node reads formats 1 to %d", store.ErrSnapshotVersion, f, snapshotFormat)
		}
		state := &shardpb.MetaSnapshot{}
		if err := proto.Unmarshal(b[8:], state); err != nil {
			return fmt.Errorf("meta: %w: %v", store.ErrCorruptSnapshot, err)
		}
		tables = make(map[string]*shardpb.TableSpec, len(state.Tables))
		for _, s := range state.Tables {
			tables[s.Name] = s
		}
		for _, j := range state.Jobs {
			jobs[j.Name] = j
		}
		for _, nd := range state.Nodes {
			nodes[nd.Id] = nd
		}
		for _, sm := range state.Shards {
			shards[ShardMapKey(sm)] = sm
		}
		version, clusterID = state.MapVersion, state.ClusterId
		evals = evalsByJob(state.Evals)
		if tokens, err = tokensByID(state.Tokens); err != nil {
			return err
		}
	} else if tables, err = restoreTablesV1(b); err != nil {
		return err
	}
	m.mu.Lock()
	m.tables, m.jobs = tables, jobs
	m.nodes, m.shards, m.mapVersion = nodes, shards, version
	m.clusterID = clusterID
	m.evals = evals
	m.tokens = tokens
	m.mu.Unlock()
	m.onChange()
	return nil
}

// restoreTablesV1 reads a format 1 snapshot: tables only.
func restoreTablesV1(b []byte) (map[string]*shardpb.TableSpec, error) {
	bad := fmt.Errorf("meta: %w: table list truncated", store.ErrCorruptSnapshot)
	if len(b) < 4 {
		return nil, bad
	}
	n := binary.LittleEndian.Uint32(b)
	b = b[4:]
	tables := make(map[string]*shardpb.TableSpec, min(n, 1024))
	for range n {
		if len(b) < 4 {
			return nil, bad
		}
		l := binary.LittleEndian.Uint32(b)
		if uint32(len(b)-4) < l {
			return nil, bad
		}
		s := &shardpb.TableSpec{}
		if err := proto.Unmarshal(b[4:4+l], s); err != nil {
			return nil, fmt.Errorf("meta: %w: %v", store.ErrCorruptSnapshot, err)
		}
		tables[s.Name] = s
		b = b[4+l:]
	}
	return tables, nil
}
