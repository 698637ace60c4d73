package shard

import (
	"encoding/binary"
	"fmt"
	"io"
	"slices"
	"sync"

	"github.com/hashicorp/raft"
	"github.com/raftps/raftps/shard/shardpb"
	"github.com/raftps/raftps/store"
	"google.golang.org/protobuf/proto"
)

// metaGroupID is the Raft group of the cluster's metadata: table specs.
const metaGroupID = "meta"

// Meta commands: a type byte, then the deterministic proto encoding of the
// argument.
const metaCreateTable byte = 1

var deterministic = proto.MarshalOptions{Deterministic: true}

func encodeMetaCreate(spec *shardpb.TableSpec) ([]byte, error) {
	b, err := deterministic.Marshal(spec)
	if err != nil {
		return nil, err
	}
	return append([]byte{metaCreateTable}, b...), nil
}

// metaFSM is the metadata group's state machine: the table specs by name.
//
// Concurrency: raft calls Apply, Snapshot and Restore one at a time; readers
// (tables, table) take mu. onChange is called after every change, from the
// FSM goroutine, and must not block.
type metaFSM struct {
	mu       sync.RWMutex // guards tables
	tables   map[string]*shardpb.TableSpec
	onChange func()
}

func newMetaFSM(onChange func()) *metaFSM {
	return &metaFSM{tables: map[string]*shardpb.TableSpec{}, onChange: onChange}
}

// Apply returns the stored *shardpb.TableSpec or an error.
func (m *metaFSM) Apply(l *raft.Log) any {
	if l.Type != raft.LogCommand {
		return nil
	}
	if len(l.Data) == 0 || l.Data[0] != metaCreateTable {
		return fmt.Errorf("meta: unknown command")
	}
	spec := &shardpb.TableSpec{}
	if err := proto.Unmarshal(l.Data[1:], spec); err != nil {
		return fmt.Errorf("meta: decoding table spec: %w", err)
	}
	m.mu.Lock()
	if _, ok := m.tables[spec.Name]; ok {
		m.mu.Unlock()
		return fmt.Errorf("table %q: %w", spec.Name, store.ErrTableExists)
	}
	m.tables[spec.Name] = spec
	m.mu.Unlock()
	m.onChange()
	return spec
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
	out := make([]*shardpb.TableSpec, 0, len(m.tables))
	for _, s := range m.tables {
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b *shardpb.TableSpec) int {
		if a.Name < b.Name {
			return -1
		}
		if a.Name > b.Name {
			return 1
		}
		return 0
	})
	return out
}

// Snapshot: count u32, then per table in name order: length u32, spec.
func (m *metaFSM) Snapshot() (raft.FSMSnapshot, error) {
	specs := m.list()
	b := binary.LittleEndian.AppendUint32(nil, uint32(len(specs)))
	for _, s := range specs {
		enc, err := deterministic.Marshal(s)
		if err != nil {
			return nil, err
		}
		b = binary.LittleEndian.AppendUint32(b, uint32(len(enc)))
		b = append(b, enc...)
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
	b, err := io.ReadAll(io.LimitReader(rc, 256<<20))
	if err != nil {
		return fmt.Errorf("meta: reading snapshot: %w", err)
	}
	bad := fmt.Errorf("meta: %w: table list truncated", store.ErrCorruptSnapshot)
	if len(b) < 4 {
		return bad
	}
	n := binary.LittleEndian.Uint32(b)
	b = b[4:]
	tables := make(map[string]*shardpb.TableSpec, n)
	for range n {
		if len(b) < 4 {
			return bad
		}
		l := binary.LittleEndian.Uint32(b)
		if uint32(len(b)-4) < l {
			return bad
		}
		s := &shardpb.TableSpec{}
		if err := proto.Unmarshal(b[4:4+l], s); err != nil {
			return fmt.Errorf("meta: %w: %v", store.ErrCorruptSnapshot, err)
		}
		tables[s.Name] = s
		b = b[4+l:]
	}
	m.mu.Lock()
	m.tables = tables
	m.mu.Unlock()
	m.onChange()
	return nil
}
