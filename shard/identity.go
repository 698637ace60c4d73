package shard

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/raftps/raftps/shard/api"
	"github.com/raftps/raftps/shard/meta"
	"github.com/raftps/raftps/shard/shardpb"
)

// A data dir's identity: which node it belongs to, and of which cluster.
//
// DATA/IDENTITY (JSON, written atomically: a temporary file, fsync, rename,
// fsync of the directory) holds the node ID, written on the first start,
// and the cluster ID, written once the node learns it. The cluster ID is
// chosen by the metadata group, once (meta.CmdSetClusterID): the metadata
// leader proposes a random one when a node registers with a cluster that
// has none (a new cluster, or one written before IDs existed), and every
// node learns it from the answer to its registration (JoinCluster) and from
// its metadata replica.
//
//   - A start with another ID than the file's is refused before anything is
//     opened (StartNode's error).
//   - After every start, a node registers with the metadata leader (it may
//     be the leader itself) carrying its file's cluster ID, and opens no
//     shard replica until the leader has answered with the same ID (or, for
//     a data dir that has none yet, with the ID it then adopts). A leader of
//     another cluster refuses (CLUSTER_MISMATCH) and the node stops
//     (Node.Failed): a data dir copied from another cluster never opens its
//     replicas where this cluster's groups would reach them.
//   - A node whose metadata replica comes to hold another cluster ID than
//     its file's stops too.
//
// A data dir written before the file existed is adopted by the node that
// starts on it (its ID is written); a copy of such a dir under another ID
// cannot be told apart.

// identityFile is the file of a data dir's identity.
const identityFile = "IDENTITY"

// ErrIdentity is a data dir that belongs to another node or cluster.
var ErrIdentity = errors.New("data dir of another node or cluster")

// dataIdentity is what IDENTITY holds.
type dataIdentity struct {
	Node    string `json:"node_id"`
	Cluster string `json:"cluster_id,omitempty"`
}

// readIdentity reads dir's identity; false if the file does not exist.
func readIdentity(dir string) (dataIdentity, bool, error) {
	var id dataIdentity
	b, err := os.ReadFile(filepath.Join(dir, identityFile))
	if errors.Is(err, os.ErrNotExist) {
		return id, false, nil
	}
	if err != nil {
		return id, false, fmt.Errorf("reading the data dir's identity: %w", err)
	}
	if err := json.Unmarshal(b, &id); err != nil || id.Node == "" {
		return id, false, fmt.Errorf("%w: %s is not a data dir identity (%v); it names the node and cluster the dir belongs to", ErrIdentity, filepath.Join(dir, identityFile), err)
	}
	return id, true, nil
}

// writeIdentity writes dir's identity atomically: a crash leaves the old
// file or the new one, whole.
func writeIdentity(dir string, id dataIdentity) error {
	b, err := json.Marshal(id)
	if err != nil {
		return err
	}
	return writeFileAtomic(dir, identityFile, append(b, '\n'))
}

// openIdentity checks the data dir's identity against the node's ID, or
// writes it on a first start; StartNode calls it before it opens anything.
func openIdentity(dataDir, nodeID string) (dataIdentity, error) {
	id, ok, err := readIdentity(dataDir)
	if err != nil {
		return id, err
	}
	if !ok {
		id = dataIdentity{Node: nodeID}
		return id, writeIdentity(dataDir, id)
	}
	if id.Node != nodeID {
		cluster := ""
		if id.Cluster != "" {
			cluster = " of cluster " + id.Cluster
		}
		return id, fmt.Errorf("%w: data dir %s belongs to node %s%s, and this node is %s: start it as %s, or give %s an empty data dir", ErrIdentity, dataDir, id.Node, cluster, nodeID, id.Node, nodeID)
	}
	return id, nil
}

// ClusterID returns the cluster ID this node's data dir belongs to, "" until
// it has learned it.
func (n *Node) ClusterID() string {
	n.identityMu.Lock()
	defer n.identityMu.Unlock()
	return n.identity.Cluster
}

// adoptClusterID checks a cluster ID the node learned (from the metadata
// leader, or its own metadata replica) against its data dir's, and records
// it there if the dir has none yet.
func (n *Node) adoptClusterID(id, from string) error {
	if id == "" {
		return nil
	}
	n.identityMu.Lock()
	defer n.identityMu.Unlock()
	switch n.identity.Cluster {
	case id:
		return nil
	case "":
		next := n.identity
		next.Cluster = id
		if err := writeIdentity(n.cfg.DataDir, next); err != nil {
			return err
		}
		n.identity = next
		n.log.Info("data dir joined its cluster", "cluster", id, "from", from)
		return nil
	}
	return fmt.Errorf("%w: data dir %s belongs to cluster %s, and %s is of cluster %s: give this node an empty data dir to join that cluster", api.ErrClusterMismatch, n.cfg.DataDir, n.identity.Cluster, from, id)
}

// confirmIdentity registers this node with the metadata leader carrying its
// data dir's cluster ID (register), and reports whether the leader
// confirmed it; a refusal for another cluster stops the node.
func (n *Node) confirmIdentity(cm *shardpb.ClusterMap) bool {
	id, err := n.register(cm, true)
	switch {
	case errors.Is(err, api.ErrClusterMismatch):
		n.fail(err)
		return false
	case err != nil:
		return false
	}
	if err := n.adoptClusterID(id, "the metadata leader"); err != nil {
		n.fail(err)
		return false
	}
	return id != ""
}

// checkClusterID stops the node if its metadata replica holds another
// cluster's ID than its data dir (a snapshot of another cluster installed).
func (n *Node) checkClusterID() {
	if err := n.adoptClusterID(n.metaFSM.ClusterID(), "this node's metadata replica"); err != nil {
		n.fail(err)
	}
}

// clusterIDOnLeader returns the cluster's ID, choosing one first if the
// metadata group has none. This node must be the metadata leader.
func (n *Node) clusterIDOnLeader() (string, error) {
	if id := n.metaFSM.ClusterID(); id != "" {
		return id, nil
	}
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("choosing a cluster ID: %w", err)
	}
	out, err := n.applyMeta(meta.CmdSetClusterID, &shardpb.MetaClusterID{Id: hex.EncodeToString(b)}, "choosing the cluster ID")
	if err != nil {
		return "", err
	}
	id, _ := out.(string)
	return id, nil
}

// fail stops the node for good: it logs err, makes Failed answer, and
// closes the node in the background.
func (n *Node) fail(err error) {
	n.failOnce.Do(func() {
		n.failErr = err
		n.log.Error("node stopping", "error", err)
		close(n.failed)
		go n.Close() // not on this goroutine: Close waits for the loops
	})
}

// Failed is closed once the node stopped itself for an error it cannot
// serve through (its data dir belongs to another cluster); Err returns it.
func (n *Node) Failed() <-chan struct{} { return n.failed }

// Err returns the error the node stopped itself for (nil if it did not).
func (n *Node) Err() error {
	select {
	case <-n.failed:
		return n.failErr
	default:
		return nil
	}
}
