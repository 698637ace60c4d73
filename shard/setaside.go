package shard

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/raftps/raftps/replication"
	"github.com/raftps/raftps/shard/meta"
	"github.com/raftps/raftps/shard/shardpb"
)

// Bad files (docs/RELIABILITY.md). A replica whose files fail their checks
// at open (replication.ErrCorruptReplica: a bad bolt page, a truncated
// file, an entry or snapshot failing its checksum, a panic while opening)
// is set aside: its directory is renamed under DataDir/set-aside, kept for
// inspection, and named in the log and in Status. The node goes on serving
// its other replicas and reports the lost one to the metadata leader every
// reconcile round, as a broken chain replica is reported
// (reportBrokenChains), while its map still lists the node there.
//
// The replica is not opened again while the map lists this node among its
// voters (or its chain): a Raft voter that lost its log and its vote could
// elect a candidate that lacks committed entries, and a chain member that
// lost its log would break the prefix rule. The metadata leader's
// scheduler removes the node from the shard (a Raft configuration change
// committed by the other replicas, or a chain removal), then adds it back
// as any repair does: a Raft replica opens empty as the node being added,
// receives a snapshot and the log as a non-voter and becomes a voter once
// caught up; a chain replica is appended at the tail and copies its
// predecessor.

// setAsideDir is where a node moves the files of replicas it set aside.
const setAsideDir = "set-aside"

// setAside is one replica this node set aside since it started.
type setAside struct {
	group, reason, movedTo string
	at                     time.Time
	chain                  bool
	// reopened: the map no longer listed this node as a member, so a new
	// replica may be (or has been) opened in its place.
	reopened bool
}

// setAsideSet is the node's record of set-aside replicas.
// Concurrency: mu guards m; reconcileLoop writes it, Status reads it.
type setAsideSet struct {
	mu sync.Mutex
	m  map[string]*setAside // by group ID
}

// blocked reports whether group's replica is set aside and may not be
// opened: the map still lists this node as a member (member is that).
// Once the map does not, the record is marked reopened and blocks no more.
func (s *setAsideSet) blocked(group string, member bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	a := s.m[group]
	if a == nil || a.reopened {
		return false
	}
	if !member {
		a.reopened = true
		return false
	}
	return true
}

func (s *setAsideSet) add(a *setAside) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[string]*setAside{}
	}
	s.m[a.group] = a
}

// pending returns the set-aside replicas not yet reopened.
func (s *setAsideSet) pending() []setAside {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []setAside
	for _, g := range slices.Sorted(maps.Keys(s.m)) {
		if a := s.m[g]; !a.reopened {
			out = append(out, *a)
		}
	}
	return out
}

// status lists every set-aside replica for Status.
func (s *setAsideSet) status() []*shardpb.SetAsideReplica {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*shardpb.SetAsideReplica
	for _, g := range slices.Sorted(maps.Keys(s.m)) {
		a := s.m[g]
		out = append(out, &shardpb.SetAsideReplica{Group: a.group, Reason: a.reason, MovedTo: a.movedTo, AtUnixMs: a.at.UnixMilli(), Reopened: a.reopened})
	}
	return out
}

// openFailed handles a replica that failed to open: a corrupt one is set
// aside (and true returned); any other failure is only logged, and the
// next reconcile round tries again.
func (n *Node) openFailed(group, dir string, chain bool, err error) bool {
	if !errors.Is(err, replication.ErrCorruptReplica) {
		return false
	}
	a := &setAside{group: group, reason: err.Error(), at: time.Now(), chain: chain}
	kind := "groups"
	if chain {
		kind = "chains"
	}
	dest := filepath.Join(n.cfg.DataDir, setAsideDir, kind, fmt.Sprintf("%s@%s", filepath.FromSlash(group), a.at.UTC().Format("20060102T150405.000")))
	if mvErr := moveAside(dir, dest, a.reason); mvErr != nil {
		// The replica stays blocked: opening it again would fail again,
		// and a fresh one must not be opened over its files.
		n.log.Error("replica's files are corrupt and could not be moved aside; it stays closed", "group", group, "dir", dir, "error", err, "move_error", mvErr)
		a.movedTo = dir + " (not moved: " + mvErr.Error() + ")"
	} else {
		a.movedTo = dest
		n.log.Error("replica's files are corrupt: set aside, to be rebuilt from its peers", "group", group, "moved_to", dest, "error", err)
	}
	n.setAside.add(a)
	n.kickReconcile()
	return true
}

// moveAside renames dir to dest and writes why into dest/REASON.
func moveAside(dir, dest, reason string) error {
	if err := os.MkdirAll(filepath.Dir(dest), 0o755); err != nil {
		return err
	}
	if err := os.Rename(dir, dest); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dest, "REASON"), []byte(reason+"\n"), 0o644)
}

// reportSetAside reports this node's set-aside replicas that the map still
// lists here to the metadata leader (takeBrokenReport), with the map epoch
// this node has for each: the scheduler acts on a report only at the
// shard's current epoch, so a report that crosses the removal is ignored.
func (n *Node) reportSetAside() {
	for _, a := range n.setAside.pending() {
		sm := n.metaFSM.ShardMapByID(a.group)
		if sm == nil || !slices.Contains(sm.Replicas, n.cfg.ID) {
			continue
		}
		r := &shardpb.ReportBrokenRequest{NodeId: n.cfg.ID, Group: meta.ShardMapKey(sm), Epoch: sm.Epoch, Reason: a.reason, SetAside: true}
		if err := n.sendBrokenReport(r); err != nil {
			n.log.Warn("reporting a set-aside replica to the metadata leader", "group", a.group, "error", err)
		}
	}
}
