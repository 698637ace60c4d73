package replication

import (
	"slices"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// DiskSpace is what a node's transports ask before they take data that
// their replicas will write to disk (the node's disk guard implements it):
// a full disk stops writes, not the node. See docs/RELIABILITY.md, "Full
// disk".
type DiskSpace interface {
	// Check returns an error while the disk is below its minimum free
	// space.
	Check() error
	// Admit returns an error if n more bytes would take the disk below its
	// minimum free space.
	Admit(n int64) error
}

// admitWrite refuses, while the node's disk is short of space, the Raft
// messages that would make a group write more than a few bytes: appends
// that carry entries (unless the group is exempt, MuxConfig.SpaceExempt)
// and snapshots larger than the space above the minimum. Heartbeats, votes
// and empty appends pass: they write at most a term, which the minimum
// free space is kept for. A follower that refuses entries falls behind
// while the other replicas commit, and catches up once space returns.
func (m *Mux) admitWrite(group string, cmd any) error {
	sp := m.cfg.Space
	if sp == nil {
		return nil
	}
	var err error
	switch r := cmd.(type) {
	case *raft.AppendEntriesRequest:
		if len(r.Entries) > 0 && !slices.Contains(m.cfg.SpaceExempt, group) {
			err = sp.Check()
		}
	case *raft.InstallSnapshotRequest:
		err = sp.Admit(r.Size)
	}
	if err != nil {
		return status.Errorf(codes.ResourceExhausted, "raft group %q: %v", group, err)
	}
	return nil
}

// spaceStable is raft's stable store with one retry of a write that failed
// for lack of space, after onNoSpace freed some (it reports whether it
// did): hashicorp/raft panics when it cannot save its current term
// ("failed to save current term"), and a node must not die of a full disk.
type spaceStable struct {
	raft.StableStore
	onNoSpace func() bool
}

func (s spaceStable) retry(err error, write func() error) error {
	if err != nil && IsNoSpace(err) && s.onNoSpace != nil && s.onNoSpace() {
		return write()
	}
	return err
}

func (s spaceStable) Set(k, v []byte) error {
	write := func() error { return s.StableStore.Set(k, v) }
	return s.retry(write(), write)
}

func (s spaceStable) SetUint64(k []byte, v uint64) error {
	write := func() error { return s.StableStore.SetUint64(k, v) }
	return s.retry(write(), write)
}
