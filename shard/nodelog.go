package shard

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/raftps/raftps/replication"
)

// openNodeLog opens the node's shared log (replication.NodeLog). A shared
// file that fails its checks is set aside under DataDir/set-aside/logs and
// an empty one opened in its place, so that the node starts (rather than
// failing at every start, in a loop): every replica whose log was in it then
// finds its log missing at open, is set aside in turn (openFailed) and
// rebuilt from its peers, as a replica with a corrupt file of its own is.
func (n *Node) openNodeLog() (*replication.NodeLog, error) {
	cfg := replication.NodeLogConfig{Root: n.cfg.DataDir, NoSync: n.cfg.Raft.NoSync, Logger: n.log.Named("shared-log")}
	l, err := replication.OpenNodeLog(cfg)
	if err == nil || !errors.Is(err, replication.ErrCorruptReplica) {
		return l, err
	}
	path := filepath.Join(n.cfg.DataDir, replication.NodeLogFile)
	dest := filepath.Join(n.cfg.DataDir, setAsideDir, "logs", "raft-logs@"+time.Now().UTC().Format("20060102T150405.000"))
	if mvErr := moveAside(filepath.Dir(path), dest, err.Error()); mvErr != nil {
		return nil, fmt.Errorf("%w (and setting it aside failed: %v)", err, mvErr)
	}
	n.log.Error("the shared Raft log is corrupt: set aside; the replicas that had their logs in it will be set aside and rebuilt from their peers", "moved_to", dest, "error", err)
	return replication.OpenNodeLog(cfg)
}

// closeNodeLog closes the shared log, after the replicas using it.
func (n *Node) closeNodeLog() error {
	if n.logs == nil {
		return nil
	}
	if err := n.logs.Close(); err != nil {
		return fmt.Errorf("shared log: %w", err)
	}
	return nil
}

// sweepNodeLog deletes the shared log's records of replicas whose
// directories were deleted or set aside (replication.NodeLog.Sweep): one
// read transaction, and a file read per replica that is not open.
func (n *Node) sweepNodeLog() {
	if n.logs == nil {
		return
	}
	if _, err := n.logs.Sweep(); err != nil {
		n.log.Warn("sweeping the shared log", "error", err)
	}
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// writeFileAtomic replaces dir/name with b, durably (replication.WriteFileAtomic).
func writeFileAtomic(dir, name string, b []byte) error {
	return replication.WriteFileAtomic(dir, name, b)
}
