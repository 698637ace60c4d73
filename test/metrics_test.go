package test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/raftps/raftps/shard/client"
)

// needTool returns the path of a program a test needs. The Makefile
// installs it; under CI its absence fails the test, elsewhere it skips.
func needTool(t *testing.T, name, pkg string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err == nil {
		return p
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("%s not found: make test installs Debian's %s", name, pkg)
	}
	t.Skipf("%s not found (make test installs Debian's %s)", name, pkg)
	return ""
}

// httpAddrs are the HTTP addresses of a binaryCluster's nodes: cluster up
// gives node K the client port base+K-1 and the HTTP port base+100+K-1.
func httpAddrs(t *testing.T, addrs string) []string {
	t.Helper()
	var out []string
	for _, a := range strings.Split(addrs, ",") {
		var host string
		var port int
		i := strings.LastIndexByte(a, ':')
		host = a[:i]
		if _, err := fmt.Sscan(a[i+1:], &port); err != nil {
			t.Fatalf("address %q: %v", a, err)
		}
		out = append(out, fmt.Sprintf("%s:%d", host, port+100))
	}
	return out
}

func scrape(t *testing.T, addr string) []byte {
	t.Helper()
	hc := http.Client{Timeout: 10 * time.Second}
	resp, err := hc.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("scraping %s: %v", addr, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("scraping %s: %v %s", addr, err, resp.Status)
	}
	return b
}

// sumOf adds the values of family name's series whose labels include want.
func sumOf(fams map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	f := fams[name]
	if f == nil {
		return 0
	}
	var sum float64
	for _, m := range f.Metric {
		ok := true
		for k, v := range want {
			found := false
			for _, l := range m.Label {
				if l.GetName() == k && l.GetValue() == v {
					found = true
				}
			}
			ok = ok && found
		}
		if !ok {
			continue
		}
		switch {
		case m.Counter != nil:
			sum += m.Counter.GetValue()
		case m.Gauge != nil:
			sum += m.Gauge.GetValue()
		case m.Histogram != nil:
			sum += m.Histogram.GetSampleSum()
		}
	}
	return sum
}

// TestMetricsCountTheWork runs pushes and pulls against a 3-node cluster
// of the binary, scrapes every node's /metrics, has promtool check each
// exposition, and checks that the counters add up to the work done: the
// rows pushed and pulled (each call is answered by one node), the rows
// every replica applied (each of the 3 replicas applies every push), and
// the replicas and leaders the nodes say they hold.
func TestMetricsCountTheWork(t *testing.T) {
	waitsMostly(t)
	promtool := needTool(t, "promtool", "prometheus")
	bin, _, cluster := binaryCluster(t, fastTimeouts)
	runRaftps(t, bin, "table", "create", "met", "--dim", "4", "--shards", "4", "--optimizer", "sgd:lr=1", "--init", "zeros", "--cluster", cluster)

	cfg := testClientConfig(t, cluster)
	clientReg := prometheus.NewRegistry()
	cfg.Metrics = clientReg
	cl, err := client.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const calls, batch = 40, 50
	pushed, pulled := 0, 0
	for i := range calls {
		keys := make([]uint64, batch)
		grads := make([]float32, batch*4)
		for j := range keys {
			keys[j] = uint64(i*batch + j)
			grads[j*4] = -1
		}
		if err := cl.Push(ctx, "met", keys, grads); err != nil {
			t.Fatal(err)
		}
		pushed += batch
		out := make([]float32, batch*4)
		if err := cl.Pull(ctx, "met", keys, out); err != nil {
			t.Fatal(err)
		}
		pulled += batch
		if out[0] != 1 {
			t.Fatalf("pull after push: row %d = %v, want 1", keys[0], out[:4])
		}
	}

	type sums struct{ pushRows, pullRows, applied, replicas, leaders, metaLeaders float64 }
	collect := func(check bool) (s sums) {
		// seen: every family some node serves (a node that leads no shard
		// of the table serves no rows_total for it).
		seen := map[string]*dto.MetricFamily{}
		if check {
			defer func() { checkDeployNames(t, seen) }()
		}
		for _, addr := range httpAddrs(t, cluster) {
			b := scrape(t, addr)
			p := expfmt.NewTextParser(model.UTF8Validation)
			fams, err := p.TextToMetricFamilies(bytes.NewReader(b))
			if err != nil {
				t.Fatalf("parsing %s's metrics: %v", addr, err)
			}
			s.pushRows += sumOf(fams, "raftps_rows_total", map[string]string{"op": "push", "table": "met"})
			s.pullRows += sumOf(fams, "raftps_rows_total", map[string]string{"op": "pull", "table": "met"})
			s.applied += sumOf(fams, "raftps_entry_rows", map[string]string{"table": "met"})
			s.replicas += sumOf(fams, "raftps_node_replicas", nil)
			s.leaders += sumOf(fams, "raftps_node_leaders", nil)
			s.metaLeaders += sumOf(fams, "raftps_meta_leader", nil)
			if !check {
				continue
			}
			cmd := exec.Command(promtool, "check", "metrics")
			cmd.Stdin = bytes.NewReader(b)
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Errorf("promtool check metrics on %s: %v\n%s", addr, err, out)
			}
			for _, name := range []string{"go_goroutines", "process_resident_memory_bytes", "raftps_request_duration_seconds",
				"raftps_raft_log_append_seconds", "raftps_apply_seconds", "raftps_raft_term", "raftps_cluster_members", "raftps_disk_free_bytes"} {
				if fams[name] == nil {
					t.Errorf("%s serves no %s", addr, name)
				}
			}
			if got := sumOf(fams, "raftps_cluster_members", map[string]string{"state": "alive"}); got != 3 {
				t.Errorf("%s: raftps_cluster_members{state=alive} = %v, want 3", addr, got)
			}
			for name, f := range fams {
				seen[name] = f
			}
		}
		return s
	}
	// Followers apply an entry once they learn it committed (the next
	// message from the leader): wait for every replica's applies. On a
	// loaded machine a group may be between leaders for a moment: wait for
	// every shard to have one.
	s := collect(true)
	for deadline := time.Now().Add(15 * time.Second); (s.applied < 3*float64(pushed) || s.leaders != 4) && time.Now().Before(deadline); {
		time.Sleep(200 * time.Millisecond)
		s = collect(false)
	}
	pushRows, pullRows, applied := s.pushRows, s.pullRows, s.applied
	replicas, leaders, metaLeaders := s.replicas, s.leaders, s.metaLeaders
	// The client counts its own calls exactly.
	cfams, err := clientReg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]*dto.MetricFamily{}
	for _, f := range cfams {
		byName[f.GetName()] = f
	}
	if got := sumOf(byName, "raftps_client_rows_total", map[string]string{"op": "push", "table": "met"}); got != float64(pushed) {
		t.Errorf("the client's raftps_client_rows_total{op=push} = %v, want %d", got, pushed)
	}
	if got := sumOf(byName, "raftps_client_calls_total", map[string]string{"op": "pull", "table": "met", "outcome": "ok"}); got != calls {
		t.Errorf("the client's raftps_client_calls_total{op=pull,outcome=ok} = %v, want %d", got, calls)
	}
	// A push whose answer was lost may be sent again (and counted again,
	// though applied once): allow one batch.
	if pushRows < float64(pushed) || pushRows > float64(pushed+batch) {
		t.Errorf("raftps_rows_total{op=push} summed over the nodes = %v, want %d (+ at most one batch)", pushRows, pushed)
	}
	if pullRows < float64(pulled) || pullRows > float64(pulled+batch) {
		t.Errorf("raftps_rows_total{op=pull} summed over the nodes = %v, want %d (+ at most one batch)", pullRows, pulled)
	}
	// Every replica applies every push once; a push sent again is in its
	// entry again (and skipped by the dedupe record): allow one batch.
	if applied < 3*float64(pushed) || applied > 3*float64(pushed+batch) {
		t.Errorf("raftps_entry_rows summed over the replicas = %v, want 3×%d (+ at most one batch)", applied, pushed)
	}
	if replicas != 12 || leaders != 4 || metaLeaders != 1 {
		t.Errorf("nodes say they hold %v replicas and lead %v shards and %v metadata groups; want 12 (4 shards × 3), 4 and 1", replicas, leaders, metaLeaders)
	}
}

// seriesOnlyWithWork are families that have no series (so no entry in the
// exposition) until their kind of work happens: hot keys, refusals.
var seriesOnlyWithWork = map[string]bool{"raftps_hot_keys": true, "raftps_hot_read_replicas": true, "raftps_requests_refused_total": true}

var metricNameRE = regexp.MustCompile(`\braftps_[a-z0-9_]+`)

// checkDeployNames checks that every node metric the alerts and the Grafana
// dashboard in deploy/ name is one a node serves: a renamed metric must
// not leave them blind. Trainer metrics come from trainers, not nodes.
func checkDeployNames(t *testing.T, fams map[string]*dto.MetricFamily) {
	t.Helper()
	for _, f := range []string{"../deploy/alerts.yml", "../deploy/grafana-dashboard.json"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range metricNameRE.FindAllString(string(b), -1) {
			if strings.HasPrefix(name, "raftps_trainer_") {
				continue
			}
			base := name
			for _, suf := range []string{"_bucket", "_sum", "_count"} {
				if b, ok := strings.CutSuffix(name, suf); ok && fams[b] != nil {
					base = b
				}
			}
			if fams[base] == nil && !seriesOnlyWithWork[base] {
				t.Errorf("%s names %s, which no node serves", f, name)
			}
		}
	}
}

// TestDeployPrometheusConfig: promtool accepts the scrape configuration
// and the alerting rules shipped in deploy/.
func TestDeployPrometheusConfig(t *testing.T) {
	promtool := needTool(t, "promtool", "prometheus")
	for _, args := range [][]string{{"check", "config", "../deploy/prometheus.yml"}, {"check", "rules", "../deploy/alerts.yml"}} {
		if out, err := exec.Command(promtool, args...).CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}
