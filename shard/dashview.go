package shard

import (
	"context"
	"fmt"
	"time"

	"github.com/raftps/raftps/shard/api"
	"github.com/raftps/raftps/shard/client"
	"github.com/raftps/raftps/shard/shardpb"
)

// The dashboard's view of the cluster, as this node pieces it together:
// every node's status (asked over the peer API, with this node's own
// credentials, so a browser needs none) and the tables of this node's
// cluster map.

type dashView struct {
	Node    string               `json:"node"`
	Time    time.Time            `json:"time"`
	Cluster client.ClusterStatus `json:"cluster"`
	Tables  []dashTable          `json:"tables"`
	Evals   []dashEvals          `json:"evals"`
}

// dashEvals is a job's evaluation curve; BayesAUC is 0 where unknown.
type dashEvals struct {
	Job      string             `json:"job"`
	BayesAUC float64            `json:"bayes_auc"`
	Points   []client.EvalPoint `json:"points"`
}

type dashTable struct {
	Name        string      `json:"name"`
	Dim         uint32      `json:"dim"`
	Shards      uint32      `json:"shards"`
	Replicas    uint32      `json:"replicas"`
	Replication string      `json:"replication"`
	Consistency string      `json:"consistency"`
	Optimizer   string      `json:"optimizer"`
	Placement   []dashShard `json:"placement"`
}

type dashShard struct {
	Shard    uint32   `json:"shard"`
	Replicas []string `json:"replicas"`
	Adding   string   `json:"adding,omitempty"`
}

// dashStatusTimeout bounds the wait for one node: a dead node's gap must
// show on the page within a poll or two.
const dashStatusTimeout = time.Second

func (n *Node) dashboardView(ctx context.Context) (any, error) {
	cm := n.metaFSM.ClusterMap()
	peerOf := map[string]string{} // client address -> peer address
	for _, nd := range cm.Nodes {
		peerOf[nd.Addr] = nd.PeerAddr
	}
	peerOf[n.cfg.Addr] = n.cfg.PeerAddr
	cs, err := client.GatherStatus(ctx, []string{n.cfg.Addr}, dashStatusTimeout, func(ctx context.Context, addr string) (client.NodeStatus, error) {
		peer, ok := peerOf[addr]
		if !ok {
			return client.NodeStatus{}, fmt.Errorf("node at %s is not in the cluster map", addr)
		}
		st, err := n.statusOf(ctx, peer)
		if err != nil {
			return client.NodeStatus{}, err
		}
		return client.StatusFromProto(st), nil
	})
	if err != nil {
		return nil, err
	}
	v := dashView{Node: n.cfg.ID, Time: time.Now(), Cluster: cs, Tables: []dashTable{}, Evals: []dashEvals{}}
	for _, je := range n.metaFSM.Evals() {
		e := dashEvals{Job: je.Job}
		for _, p := range je.Points {
			e.Points = append(e.Points, client.EvalPoint{Step: int(p.Step), Seconds: p.Seconds, AUC: p.Auc, LogLoss: p.Logloss,
				BayesAUC: p.BayesAuc, BayesLogLoss: p.BayesLogloss})
			e.BayesAUC = p.BayesAuc
		}
		v.Evals = append(v.Evals, e)
	}
	shards := map[string][]dashShard{}
	for _, sm := range cm.Shards {
		shards[sm.Table] = append(shards[sm.Table], dashShard{Shard: sm.Shard, Replicas: sm.Replicas, Adding: sm.Adding})
	}
	for _, t := range cm.Tables {
		v.Tables = append(v.Tables, dashTable{Name: t.Name, Dim: t.Dim, Shards: t.Shards, Replicas: t.Replicas,
			Replication: t.Replication, Consistency: consistencyText(t), Optimizer: t.Optimizer, Placement: shards[t.Name]})
	}
	return v, nil
}

func consistencyText(t *shardpb.TableSpec) string {
	name := api.LevelName(t.Consistency)
	if t.Consistency == shardpb.Consistency_CONSISTENCY_BOUNDED {
		return fmt.Sprintf("%s:%s", name, time.Duration(t.StalenessBoundNs))
	}
	return name
}
