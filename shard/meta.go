package shard

import (
	"encoding/binary"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/raftps/raftps/shard/api"

	"github.com/hashicorp/raft"
	"github.com/raftps/raftps/shard/shardpb"
	"github.com/raftps/raftps/store"
	"google.golang.org/protobuf/proto"
)

// Meta commands: a type byte, then the deterministic proto encoding of the
// argument.
const (
	// metaCreateTable is the command of clusters before the cluster map:
	// the table gets no placement. Still applied, so that old logs replay.
	metaCreateTable   byte = 1 // a *shardpb.TableSpec
	metaJoinJob       byte = 2 // a *shardpb.JoinJobRequest
	metaDeleteJob     byte = 3 // a *shardpb.DeleteJobRequest
	metaCreateTableV2 byte = 4 // a *shardpb.MetaCreateTable
	metaRegisterNode  byte = 5 // a *shardpb.ClusterNode
	metaSetNodeAdmin  byte = 6 // a *shardpb.SetNodeAdminRequest
	metaForgetNode    byte = 7 // a *shardpb.SetNodeAdminRequest (id only)
	metaSetShard      byte = 8 // a *shardpb.MetaSetShard
	metaAlterTable    byte = 9 // a *shardpb.TableSpec: the whole new spec
)

var deterministic = proto.MarshalOptions{Deterministic: true}

func encodeMeta(cmd byte, arg proto.Message) ([]byte, error) {
	b, err := deterministic.Marshal(arg)
	if err != nil {
		return nil, fmt.Errorf("meta: encoding command %d: %w", cmd, err)
	}
	return append([]byte{cmd}, b...), nil
}

// metaFSM is the metadata group's state machine: the table specs and the
// trainer jobs, by name.
//
// Concurrency: raft calls Apply, Snapshot and Restore one at a time; readers
// (list, table, job, jobList) take mu. onChange is called after every
// change of the tables, from the FSM goroutine, and must not block; job
// changes do not call it, since only tables concern the reconcile loop.
type metaFSM struct {
	mu     sync.RWMutex // guards tables, jobs and the cluster map
	tables map[string]*shardpb.TableSpec
	jobs   map[string]*shardpb.Job // values never modified: see jobs.go
	// The cluster map (clustermap.go). Values are never modified, only
	// replaced, so readers may keep them.
	nodes      map[string]*shardpb.ClusterNode // by node ID
	shards     map[string]*shardpb.ShardMap    // by api.GroupID
	mapVersion uint64                          // +1 on every map change
	onChange   func()
	// processed is the highest log index the FSM is known to have taken
	// in: the last command applied or configuration stored (both in log
	// order, by the FSM goroutine), or a barrier that completed. Every
	// entry up to it is reflected in the state. See metaReadIndex.
	processed atomic.Uint64
}

// noteProcessed raises processed to ix.
func (m *metaFSM) noteProcessed(ix uint64) {
	for {
		cur := m.processed.Load()
		if ix <= cur || m.processed.CompareAndSwap(cur, ix) {
			return
		}
	}
}

// StoreConfiguration makes metaFSM a raft.ConfigurationStore, only so
// that processed counts configuration entries too: without it a
// configuration change as the newest committed entry would leave
// metaReadIndex waiting for the next command.
func (m *metaFSM) StoreConfiguration(index uint64, _ raft.Configuration) {
	m.noteProcessed(index)
}

func newMetaFSM(onChange func()) *metaFSM {
	return &metaFSM{
		tables: map[string]*shardpb.TableSpec{}, jobs: map[string]*shardpb.Job{},
		nodes: map[string]*shardpb.ClusterNode{}, shards: map[string]*shardpb.ShardMap{},
		onChange: onChange,
	}
}

// Apply returns, by command: the stored *shardpb.TableSpec, the joiner's
// *shardpb.JoinJobResponse, nil for a deleted job; or an error. An error
// changes nothing.
func (m *metaFSM) Apply(l *raft.Log) any {
	defer m.noteProcessed(l.Index) // after the change is in place
	if l.Type != raft.LogCommand {
		return nil
	}
	if len(l.Data) == 0 {
		return fmt.Errorf("meta: empty command")
	}
	switch cmd, arg := l.Data[0], l.Data[1:]; cmd {
	case metaCreateTable:
		return m.applyCreate(arg)
	case metaJoinJob:
		return m.applyJoin(arg)
	case metaDeleteJob:
		return m.applyDelete(arg)
	case metaCreateTableV2:
		return m.applyCreateV2(arg)
	case metaRegisterNode:
		return m.applyRegister(arg)
	case metaSetNodeAdmin:
		return m.applySetAdmin(arg)
	case metaForgetNode:
		return m.applyForget(arg)
	case metaSetShard:
		return m.applySetShard(arg)
	case metaAlterTable:
		return m.applyAlter(arg)
	default:
		return fmt.Errorf("meta: unknown command %d", cmd)
	}
}

func (m *metaFSM) applyCreate(arg []byte) any {
	spec := &shardpb.TableSpec{}
	if err := proto.Unmarshal(arg, spec); err != nil {
		return fmt.Errorf("meta: decoding table spec: %w", err)
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
func (m *metaFSM) applyAlter(arg []byte) any {
	spec := &shardpb.TableSpec{}
	if err := proto.Unmarshal(arg, spec); err != nil {
		return fmt.Errorf("meta: decoding table spec: %w", err)
	}
	if err := api.CheckLevel(spec); err != nil {
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

func (m *metaFSM) applyJoin(arg []byte) any {
	req := &shardpb.JoinJobRequest{}
	if err := proto.Unmarshal(arg, req); err != nil {
		return fmt.Errorf("meta: decoding job join: %w", err)
	}
	if err := checkJoinRequest(req); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	j, rank, err := joinJob(m.jobs[req.Job], req)
	if err != nil {
		return err
	}
	m.jobs[req.Job] = j
	return &shardpb.JoinJobResponse{Rank: rank, Round: j.Round}
}

func (m *metaFSM) applyDelete(arg []byte) any {
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
	return nil
}

// job returns the named job (not to be modified) or nil.
func (m *metaFSM) job(name string) *shardpb.Job {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.jobs[name]
}

// jobList returns the jobs sorted by name.
func (m *metaFSM) jobList() []*shardpb.Job {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return sortedByName(m.jobs, (*shardpb.Job).GetName)
}

func sortedByName[V any](byName map[string]V, name func(V) string) []V {
	out := make([]V, 0, len(byName))
	for _, v := range byName {
		out = append(out, v)
	}
	slices.SortFunc(out, func(a, b V) int { return strings.Compare(name(a), name(b)) })
	return out
}

// table returns the named spec (not to be modified) or nil.
func (m *metaFSM) table(name string) *shardpb.TableSpec {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.tables[name]
}

// list returns the specs sorted by name.
func (m *metaFSM) list() []*shardpb.TableSpec {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return sortedByName(m.tables, (*shardpb.TableSpec).GetName)
}

// Snapshot formats. Format 1, written before the job registry existed: the
// table count u32, then per table in name order its length u32 and spec.
// Format 2: metaSnapshotMarker u32, the format u32, then a
// shardpb.MetaSnapshot with tables and jobs; format 3 is the same with the
// cluster map too. Restore reads all three. The marker cannot begin a format 1
// snapshot: 2^32-1 tables of at least 4 bytes each are far more than the
// 256 MiB Restore reads.
const (
	metaSnapshotMarker  = 0xFFFFFFFF
	metaSnapshotFormat  = 3
	maxMetaSnapshotSize = 256 << 20
)

// Snapshot writes format 3. The tables and jobs are taken under one lock, so
// they are of the same applied index.
func (m *metaFSM) Snapshot() (raft.FSMSnapshot, error) {
	m.mu.RLock()
	state := &shardpb.MetaSnapshot{
		Tables:     sortedByName(m.tables, (*shardpb.TableSpec).GetName),
		Jobs:       sortedByName(m.jobs, (*shardpb.Job).GetName),
		Nodes:      sortedByName(m.nodes, (*shardpb.ClusterNode).GetId),
		Shards:     sortedByName(m.shards, shardMapKey),
		MapVersion: m.mapVersion,
	}
	m.mu.RUnlock()
	b := binary.LittleEndian.AppendUint32(nil, metaSnapshotMarker)
	b = binary.LittleEndian.AppendUint32(b, metaSnapshotFormat)
	b, err := deterministic.MarshalAppend(b, state)
	if err != nil {
		return nil, fmt.Errorf("meta: encoding snapshot: %w", err)
	}
	return metaSnapshot(b), nil
}

type metaSnapshot []byte

func (s metaSnapshot) Persist(sink raft.SnapshotSink) error {
	if _, err := sink.Write(s); err != nil {
		_ = sink.Cancel()
		return fmt.Errorf("meta: persisting snapshot: %w", err)
	}
	return sink.Close()
}

func (metaSnapshot) Release() {}

func (m *metaFSM) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, maxMetaSnapshotSize))
	if err != nil {
		return fmt.Errorf("meta: reading snapshot: %w", err)
	}
	var tables map[string]*shardpb.TableSpec
	jobs := map[string]*shardpb.Job{}
	nodes := map[string]*shardpb.ClusterNode{}
	shards := map[string]*shardpb.ShardMap{}
	var version uint64
	if len(b) >= 4 && binary.LittleEndian.Uint32(b) == metaSnapshotMarker {
		if len(b) < 8 {
			return fmt.Errorf("meta: %w: snapshot header truncated", store.ErrCorruptSnapshot)
		}
		if f := binary.LittleEndian.Uint32(b[4:]); f != 2 && f != metaSnapshotFormat {
			return fmt.Errorf("meta: %w: snapshot format %d, this node reads formats 1 to %d", store.ErrSnapshotVersion, f, metaSnapshotFormat)
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
			shards[shardMapKey(sm)] = sm
		}
		version = state.MapVersion
	} else if tables, err = restoreTablesV1(b); err != nil {
		return err
	}
	m.mu.Lock()
	m.tables, m.jobs = tables, jobs
	m.nodes, m.shards, m.mapVersion = nodes, shards, version
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
