package test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/raftps/raftps/shard/client"
)

// pageState is what the dashboard shows, read from its rendered DOM.
type pageState struct {
	Polls int `json:"polls"`
	Nodes []struct {
		ID    string `json:"id"`
		State string `json:"state"`
	} `json:"nodes"`
	Shards []struct {
		Shard  string `json:"shard"`
		Leader string `json:"leader"`
	} `json:"shards"`
}

const pageStateJS = `(() => ({
  polls: Number(document.body.dataset.polls || 0),
  nodes: [...document.querySelectorAll('#nodes tbody tr')].map(r => ({id: r.dataset.node, state: r.dataset.state})),
  shards: [...document.querySelectorAll('table.grid[data-table="dash"] tbody tr')].map(r => ({shard: r.dataset.shard, leader: r.dataset.leader})),
}))()`

func (p pageState) state(id string) string {
	for _, n := range p.Nodes {
		if n.ID == id {
			return n.State
		}
	}
	return ""
}

// leadersOK: every shard of the table shows a leader other than dead.
func (p pageState) leadersOK(shards int, dead string) bool {
	if len(p.Shards) != shards {
		return false
	}
	for _, s := range p.Shards {
		if s.Leader == "" || s.Leader == dead {
			return false
		}
	}
	return true
}

// TestDashboardInBrowser opens a node's dashboard in headless Chromium
// while a client pushes, checks from the rendered DOM that it shows the
// three nodes alive and a leader for each of a table's shards, then kills
// the node leading shard 0: within 5 s the page must show that node down
// and every shard led by a live node. The screenshot goes where
// RAFTPS_DASHBOARD_SCREENSHOT says (make dashboard-screenshot: docs/).
func TestDashboardInBrowser(t *testing.T) {
	waitsMostly(t)
	chromium := needTool(t, "chromium", "chromium")
	bin, dir, cluster := binaryCluster(t, fastTimeouts)
	const shards = 4
	runRaftps(t, bin, "table", "create", "dash", "--dim", "8", "--shards", fmt.Sprint(shards), "--cluster", cluster)
	var desc client.TableInfo
	if err := json.Unmarshal([]byte(runRaftps(t, bin, "table", "describe", "dash", "--json", "--cluster", cluster)), &desc); err != nil {
		t.Fatal(err)
	}
	victim := desc.Shards[0].LeaderID
	ids := []string{"n1", "n2", "n3"}
	if !slices.Contains(ids, victim) {
		t.Fatalf("shard 0's leader is %q", victim)
	}
	page := ""
	https := httpAddrs(t, cluster)
	for i, id := range ids {
		if id != victim {
			page = "http://" + https[i] + "/"
			break
		}
	}

	// Traffic for the charts, until the test ends.
	cfg := testClientConfig(t, cluster)
	cl, err := client.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { stop(); <-done; cl.Close() })
	go func() {
		defer close(done)
		keys, grads, out := make([]uint64, 64), make([]float32, 64*8), make([]float32, 64*8)
		for i := 0; ctx.Err() == nil; i++ {
			for j := range keys {
				keys[j] = uint64(i*64+j) % 5000
			}
			_ = cl.Push(ctx, "dash", keys, grads)
			_ = cl.Pull(ctx, "dash", keys, out)
		}
	}()

	br := startBrowser(t, chromium)
	if err := br.navigate(page); err != nil {
		t.Fatal(err)
	}
	var st pageState
	waitPage := func(limit time.Duration, what string, ok func(pageState) bool) time.Duration {
		t.Helper()
		start := time.Now()
		for {
			err := br.eval(pageStateJS, &st)
			if err == nil && ok(st) {
				return time.Since(start)
			}
			if time.Since(start) > limit {
				t.Fatalf("the dashboard at %s did not show %s within %v (err %v); it shows %+v", page, what, limit, err, st)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	waitPage(30*time.Second, "three live nodes and a leader for each shard", func(p pageState) bool {
		return p.Polls >= 3 && len(p.Nodes) == 3 && p.state("n1") == "alive" && p.state("n2") == "alive" && p.state("n3") == "alive" && p.leadersOK(shards, "")
	})

	runRaftps(t, bin, "cluster", "kill", victim, "--dir", dir)
	took := waitPage(5*time.Second, victim+" down and every shard led by a live node", func(p pageState) bool {
		s := p.state(victim)
		return (s == "down" || s == "dead") && p.leadersOK(shards, victim)
	})
	t.Logf("the page showed %s down and new leaders %v after the kill", victim, took.Round(10*time.Millisecond))

	shot := os.Getenv("RAFTPS_DASHBOARD_SCREENSHOT")
	if shot == "" {
		shot = filepath.Join(t.TempDir(), "dashboard.png")
	}
	time.Sleep(3 * time.Second) // a few more points on the charts after the gap
	if err := br.screenshot(shot); err != nil {
		t.Errorf("screenshot: %v", err)
	}
}
