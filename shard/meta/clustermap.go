package meta

import (
	"fmt"
	"slices"

	"github.com/raftps/raftps/shard/api"
	"github.com/raftps/raftps/shard/certs"

	"github.com/raftps/raftps/shard/shardpb"
	"github.com/raftps/raftps/store"
	"google.golang.org/protobuf/proto"
)

// The cluster map is part of the metadata FSM: the nodes (ID, addresses,
// admin state) and, for every shard, its replica set, the node being added
// to it, and an epoch. It changes only through metadata commands, applied in
// log order on every metadata replica, so every node that has applied index
// i has the same map. The node's scheduler (shard/scheduler.go) decides the
// changes; the shard groups carry them out (shard/reconfigure.go).
//
// Epoch rules: a shard's entry starts at epoch 1 when its table is created
// and every change (replica set, order, node being added) adds 1, through
// CmdSetShard's compare-and-set on the epoch, so two schedulers (an old
// metadata leader that has not noticed it lost leadership, and the new one)
// can never both apply a change decided from the same state. Epoch 1 also
// means "as created": only then may a replica bootstrap the group.
//
// For a chain table the entry's replica list is the chain's order, head
// first, and its epoch the chain's epoch: see shard/chainsched.go for the only
// changes the scheduler makes to a chain's order.

// ShardMapKey is the key of a shard's entry: its group ID.
func ShardMapKey(sm *shardpb.ShardMap) string { return api.GroupID(sm.Table, sm.Shard) }

// AdminName is how an admin state is shown: active, draining or removed.
func AdminName(a shardpb.NodeAdmin) string {
	switch a {
	case shardpb.NodeAdmin_NODE_DRAINING:
		return "draining"
	case shardpb.NodeAdmin_NODE_REMOVED:
		return "removed"
	}
	return "active"
}

func (m *FSM) changed() {
	m.mapVersion++
}

func (m *FSM) applyCreateV2(arg []byte, index uint64) any {
	c := &shardpb.MetaCreateTable{}
	if err := proto.Unmarshal(arg, c); err != nil {
		return fmt.Errorf("meta: decoding table creation: %w", err)
	}
	spec := c.Spec
	if spec == nil || spec.Name == "" || spec.Shards == 0 || uint32(len(c.Shards)) != spec.Shards {
		return fmt.Errorf("meta: %w: table creation with %d shard entries for %d shards", api.ErrBadRequest, len(c.Shards), spec.GetShards())
	}
	if err := checkStoredSpec(spec); err != nil {
		return err
	}
	m.mu.Lock()
	if _, ok := m.tables[spec.Name]; ok {
		m.mu.Unlock()
		return fmt.Errorf("table %q: %w", spec.Name, store.ErrTableExists)
	}
	if err := m.checkCreateQuotasLocked(c); err != nil {
		m.mu.Unlock()
		return err
	}
	// The leader builds the command, but it is checked here, on the state it
	// applies to: a node may have been forgotten since it was decided.
	seen := make([]bool, spec.Shards)
	for _, sm := range c.Shards {
		if sm.Shard >= spec.Shards || seen[sm.Shard] {
			m.mu.Unlock()
			return fmt.Errorf("meta: %w: table %q: shard entry %d repeated or out of range", api.ErrBadRequest, spec.Name, sm.Shard)
		}
		seen[sm.Shard] = true
		if err := m.checkReplicasLocked(api.GroupID(spec.Name, sm.Shard), sm.Replicas, ""); err != nil {
			m.mu.Unlock()
			return err
		}
	}
	m.tables[spec.Name] = spec
	for _, sm := range c.Shards {
		sm.Table, sm.Epoch, sm.Incarnation = spec.Name, 1, index
		m.shards[ShardMapKey(sm)] = sm
	}
	m.changed()
	m.mu.Unlock()
	m.onChange()
	return spec
}

func (m *FSM) applyRegister(arg []byte) any {
	nd := &shardpb.ClusterNode{}
	if err := proto.Unmarshal(arg, nd); err != nil {
		return fmt.Errorf("meta: decoding node: %w", err)
	}
	if err := CheckNode(nd); err != nil {
		return err
	}
	m.mu.Lock()
	// Sorted, so every replica returns the same error text.
	for _, o := range sortedByName(m.nodes) {
		if o.Id != nd.Id && (o.Addr == nd.Addr || o.PeerAddr == nd.PeerAddr) {
			m.mu.Unlock()
			return fmt.Errorf("%w: node %s registers at %s (peers %s), an address of node %s (%s, peers %s)", api.ErrNodeConflict, nd.Id, nd.Addr, nd.PeerAddr, o.Id, o.Addr, o.PeerAddr)
		}
	}
	old := m.nodes[nd.Id]
	switch {
	case old != nil && old.Admin == shardpb.NodeAdmin_NODE_REMOVED:
		m.mu.Unlock()
		return fmt.Errorf("%w: node %s was removed from the cluster; start it with a new ID and an empty data directory", api.ErrNodeConflict, nd.Id)
	case old != nil && old.Addr == nd.Addr && old.PeerAddr == nd.PeerAddr && old.GossipAddr == nd.GossipAddr:
		m.mu.Unlock()
		return old // already registered: no change
	}
	if old != nil && old.PeerAddr != nd.PeerAddr {
		// Its shard groups know it at its old peer address: they would
		// never reach it, yet gossip would show it alive, so it would
		// never be repaired either. (A new client address is harmless:
		// clients learn it from the map.)
		for _, sm := range sortedByName(m.shards) {
			if slices.Contains(sm.Replicas, nd.Id) || sm.Adding == nd.Id {
				m.mu.Unlock()
				return fmt.Errorf("%w: node %s holds a replica of %s at peer address %s; restart it at that address, or remove it and join at %s with a new ID", api.ErrNodeConflict, nd.Id, ShardMapKey(sm), old.PeerAddr, nd.PeerAddr)
			}
		}
	}
	n := &shardpb.ClusterNode{Id: nd.Id, Addr: nd.Addr, PeerAddr: nd.PeerAddr, GossipAddr: nd.GossipAddr}
	if old != nil {
		n.Admin = old.Admin
	}
	m.nodes[nd.Id] = n
	m.changed()
	m.mu.Unlock()
	m.onChange()
	return n
}

// CheckNode returns an error wrapping api.ErrBadRequest unless nd may be
// registered: its ID is a node name (certs.CheckName, the rule of node
// certificates: 1 to 63 letters, digits, '.', '_' or '-', starting with a
// letter or digit) and its client, peer and (if given) gossip addresses
// pass api.CheckAddr. The node checks a JoinCluster before it proposes it,
// and Apply checks the entry again: an ID or address of megabytes would make
// an entry that never fits an AppendEntries, and stop the metadata group.
func CheckNode(nd *shardpb.ClusterNode) error {
	if id := nd.GetId(); len(id) > 64 {
		// Not quoted whole: the refusal of a megabyte ID is not a megabyte.
		return fmt.Errorf("%w: node ID %q... is %d bytes: want 1 to 63 letters, digits, '.', '_' or '-', starting with a letter or digit", api.ErrBadRequest, id[:64], len(id))
	}
	if err := certs.CheckName(nd.GetId()); err != nil {
		return fmt.Errorf("%w: node ID: %w", api.ErrBadRequest, err)
	}
	if err := api.CheckAddr("node "+nd.Id+"'s client address", nd.Addr); err != nil {
		return err
	}
	if err := api.CheckAddr("node "+nd.Id+"'s peer address", nd.PeerAddr); err != nil {
		return err
	}
	if nd.GossipAddr != "" {
		if err := api.CheckAddr("node "+nd.Id+"'s gossip address", nd.GossipAddr); err != nil {
			return err
		}
	}
	return nil
}

func (m *FSM) applySetAdmin(arg []byte) any {
	req := &shardpb.SetNodeAdminRequest{}
	if err := proto.Unmarshal(arg, req); err != nil {
		return fmt.Errorf("meta: decoding node admin change: %w", err)
	}
	m.mu.Lock()
	old := m.nodes[req.Id]
	if old == nil {
		m.mu.Unlock()
		return fmt.Errorf("node %q: %w", req.Id, api.ErrUnknownNode)
	}
	if old.Admin == shardpb.NodeAdmin_NODE_REMOVED && req.Admin != shardpb.NodeAdmin_NODE_REMOVED {
		m.mu.Unlock()
		return fmt.Errorf("%w: node %s was removed; it cannot be made %s again", api.ErrNodeConflict, req.Id, AdminName(req.Admin))
	}
	if _, ok := shardpb.NodeAdmin_name[int32(req.Admin)]; !ok {
		m.mu.Unlock()
		return fmt.Errorf("%w: node %s: admin state %d", api.ErrBadRequest, req.Id, req.Admin)
	}
	if old.Admin == req.Admin {
		m.mu.Unlock()
		return old
	}
	n := proto.Clone(old).(*shardpb.ClusterNode)
	n.Admin = req.Admin
	m.nodes[req.Id] = n
	m.changed()
	m.mu.Unlock()
	m.onChange()
	return n
}

// applyForget deletes a removed node that holds no replica.
func (m *FSM) applyForget(arg []byte) any {
	req := &shardpb.SetNodeAdminRequest{}
	if err := proto.Unmarshal(arg, req); err != nil {
		return fmt.Errorf("meta: decoding node deletion: %w", err)
	}
	m.mu.Lock()
	old := m.nodes[req.Id]
	if old == nil {
		m.mu.Unlock()
		return fmt.Errorf("node %q: %w", req.Id, api.ErrUnknownNode)
	}
	if old.Admin != shardpb.NodeAdmin_NODE_REMOVED {
		m.mu.Unlock()
		return fmt.Errorf("%w: node %s is %s, not removed", api.ErrBadRequest, req.Id, AdminName(old.Admin))
	}
	// In key order, so every replica's refusal names the same shard.
	for _, sm := range sortedByName(m.shards) {
		if slices.Contains(sm.Replicas, req.Id) || sm.Adding == req.Id {
			m.mu.Unlock()
			return fmt.Errorf("%w: node %s still holds a replica of %s", api.ErrBadRequest, req.Id, ShardMapKey(sm))
		}
	}
	delete(m.nodes, req.Id)
	m.changed()
	m.mu.Unlock()
	m.onChange()
	return nil
}

// checkReplicasLocked checks a shard entry's node lists: some replica, no
// node twice, every node known. m.mu must be held.
func (m *FSM) checkReplicasLocked(key string, replicas []string, adding string) error {
	if len(replicas) == 0 {
		return fmt.Errorf("%w: shard %s: a replica set cannot be empty", api.ErrBadRequest, key)
	}
	all := slices.Clone(replicas)
	if adding != "" {
		all = append(all, adding)
	}
	for i, id := range all {
		if slices.Contains(all[:i], id) {
			return fmt.Errorf("%w: shard %s: node %q listed twice in %v + adding %q", api.ErrBadRequest, key, id, replicas, adding)
		}
		if m.nodes[id] == nil {
			return fmt.Errorf("shard %s: node %q: %w", key, id, api.ErrUnknownNode)
		}
	}
	return nil
}

func (m *FSM) applySetShard(arg []byte) any {
	req := &shardpb.MetaSetShard{}
	if err := proto.Unmarshal(arg, req); err != nil {
		return fmt.Errorf("meta: decoding shard change: %w", err)
	}
	key := api.GroupID(req.Table, req.Shard)
	m.mu.Lock()
	old := m.shards[key]
	switch {
	case old == nil:
		m.mu.Unlock()
		return fmt.Errorf("%w: shard %s is not in the cluster map", api.ErrUnknownShard, key)
	case old.Epoch != req.ExpectEpoch:
		m.mu.Unlock()
		return fmt.Errorf("shard %s: %w: epoch %d, the change was decided at %d", key, api.ErrEpochChanged, old.Epoch, req.ExpectEpoch)
	}
	if err := m.checkReplicasLocked(key, req.Replicas, req.Adding); err != nil {
		m.mu.Unlock()
		return err
	}
	sm := &shardpb.ShardMap{Table: req.Table, Shard: req.Shard, Replicas: req.Replicas, Adding: req.Adding, Epoch: old.Epoch + 1, Incarnation: old.Incarnation}
	m.shards[key] = sm
	m.changed()
	m.mu.Unlock()
	m.onChange()
	return sm
}

// ShardMap returns a shard's entry (not to be modified) or nil.
func (m *FSM) ShardMap(table string, shard uint32) *shardpb.ShardMap {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.shards[api.GroupID(table, shard)]
}

// ShardMapByID returns the entry of the shard whose group ID is id, or nil.
func (m *FSM) ShardMapByID(id string) *shardpb.ShardMap {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.shards[id]
}

// Node returns a node's entry (not to be modified) or nil.
func (m *FSM) Node(id string) *shardpb.ClusterNode {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.nodes[id]
}

// FindNode returns the first node, by ID, that match accepts (nil if none).
func (m *FSM) FindNode(match func(*shardpb.ClusterNode) bool) *shardpb.ClusterNode {
	m.mu.RLock()
	defer m.mu.RUnlock()
	for _, nd := range sortedByName(m.nodes) {
		if match(nd) {
			return nd
		}
	}
	return nil
}

// ClusterMap returns the whole map, consistent (one lock), sorted.
func (m *FSM) ClusterMap() *shardpb.ClusterMap {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return &shardpb.ClusterMap{
		Version: m.mapVersion,
		Nodes:   sortedByName(m.nodes),
		Shards:  sortedByName(m.shards),
		Tables:  sortedByName(m.tables),
	}
}

// Version returns the map version.
func (m *FSM) Version() uint64 {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.mapVersion
}

// TableShards returns the table's shard entries in shard order (nil entries
// for shards the map lacks) and the nodes they name.
func (m *FSM) TableShards(spec *shardpb.TableSpec) ([]*shardpb.ShardMap, []*shardpb.ClusterNode) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := make([]*shardpb.ShardMap, spec.Shards)
	named := map[string]*shardpb.ClusterNode{}
	for s := range spec.Shards {
		sm := m.shards[api.GroupID(spec.Name, s)]
		out[s] = sm
		if sm == nil {
			continue
		}
		for _, id := range append(slices.Clone(sm.Replicas), sm.Adding) {
			if nd := m.nodes[id]; nd != nil {
				named[id] = nd
			}
		}
	}
	return out, sortedByName(named)
}
