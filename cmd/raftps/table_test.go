package main

import (
	"bytes"
	"flag"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/raftps/raftps/shard/client"
)

func TestParseConsistency(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want client.Consistency
		err  string
	}{
		{"linearizable", client.Consistency{Level: client.Linearizable}, ""},
		{"eventual", client.Consistency{Level: client.Eventual}, ""},
		{"bounded:100ms", client.Consistency{Level: client.Bounded, Bound: 100 * time.Millisecond}, ""},
		{"bounded", client.Consistency{}, "bounded needs its bound"},
		{"bounded:-1s", client.Consistency{}, "not a positive duration"},
		{"strong", client.Consistency{}, "want linearizable, bounded:DURATION"},
	} {
		c, err := parseConsistency(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: error %v, want %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || c != tc.want {
			t.Errorf("%q: %v %v, want %v", tc.in, c, err, tc.want)
		}
		if got := c.String(); got != tc.in {
			t.Errorf("%q printed as %q", tc.in, got)
		}
	}
}

func TestHotSetting(t *testing.T) {
	for _, tc := range []struct {
		threshold float64
		replicas  int
		want      string
	}{
		{0, 0, "off"},
		{1000, 2, ">= 1000 pulls/s, 2 read replicas"},
		{12.5, 1, ">= 12.5 pulls/s, 1 read replica"},
	} {
		if got := hotSetting(client.TableSpec{HotThreshold: tc.threshold, HotReplicas: tc.replicas}); got != tc.want {
			t.Errorf("hotSetting(%v, %d) = %q, want %q", tc.threshold, tc.replicas, got, tc.want)
		}
	}
}

// TestAlterOptions: only the flags given become changes, 0 given is a
// change, and nothing given or a bad level is refused before any call.
func TestAlterOptions(t *testing.T) {
	for _, tc := range []struct {
		args []string
		n    int
		err  string
	}{
		{args: nil, err: "nothing to change"},
		{args: []string{"--consistency", "bounded:250ms"}, n: 1},
		{args: []string{"--hot-threshold", "0"}, n: 1},
		{args: []string{"--hot-threshold", "1000", "--hot-replicas", "4", "--consistency", "eventual"}, n: 3},
		{args: []string{"--consistency", "sometimes"}, err: "want linearizable"},
	} {
		fs := flag.NewFlagSet("alter", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		cons := fs.String("consistency", "", "")
		threshold := fs.Float64("hot-threshold", 7, "")
		replicas := fs.Uint("hot-replicas", 7, "")
		if err := fs.Parse(tc.args); err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		opts, err := alterOptions(fs, *cons, *threshold, *replicas)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%v: error %v, want %q", tc.args, err, tc.err)
			}
			continue
		}
		if err != nil || len(opts) != tc.n {
			t.Errorf("%v: %d options, %v; want %d", tc.args, len(opts), err, tc.n)
		}
	}
}

func TestPullOptions(t *testing.T) {
	if o, err := pullOptions("bounded:50ms", true); err != nil || len(o) != 2 {
		t.Errorf("bounded:50ms --allow-weaker: %d options, %v", len(o), err)
	}
	if o, err := pullOptions("", false); err != nil || len(o) != 0 {
		t.Errorf("no flags: %d options, %v", len(o), err)
	}
	if _, err := pullOptions("bounded:", false); err == nil {
		t.Error("bounded: without a duration: no error")
	}
}

func TestPrintDescribe(t *testing.T) {
	d := client.TableInfo{
		Spec: client.TableSpec{Name: "users", Dim: 8, Shards: 2, Replicas: 3, Replication: "raft", Optimizer: "adagrad", Initializer: "zeros",
			Consistency: client.Consistency{Level: client.Bounded, Bound: 100 * time.Millisecond}, HotThreshold: 1000, HotReplicas: 2},
		Shards: []client.ShardInfo{{Shard: 0, LeaderID: "n1", LeaderAddr: "127.0.0.1:7001"}, {Shard: 1}},
	}
	var out bytes.Buffer
	printDescribe(&out, d, false)
	want := `table users: dim 8, 2 shards × 3 replicas (raft), adagrad, init zeros, seed 0, bounded:100ms
hot keys: >= 1000 pulls/s, 2 read replicas
gradients: fp32
SHARD  LEADER  ADDR
0      n1      127.0.0.1:7001
1      (none)  
`
	if out.String() != want {
		t.Errorf("describe:\n%s\nwant:\n%s", out.String(), want)
	}
	out.Reset()
	printDescribe(&out, d, true)
	for _, s := range []string{`"consistency": "bounded:100ms"`, `"hot_threshold": 1000`, `"hot_replicas": 2`, `"leader_id": "n1"`} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("describe --json lacks %s:\n%s", s, out.String())
		}
	}
}
