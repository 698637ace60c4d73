package main

import (
	"bytes"
	"flag"
	"fmt"
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

func TestCheckHot(t *testing.T) {
	for _, tc := range []struct {
		threshold float64
		replicas  uint
		err       string
	}{
		{0, 0, ""},
		{1000, 0, ""},
		{1000, 16, ""},
		{1000, 17, "want 0..16"},
		{-1, 0, "want pulls a second >= 0"},
		{0, 2, "without a --hot-threshold"},
	} {
		err := checkHot(tc.threshold, tc.replicas)
		if (tc.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("checkHot(%v, %d) = %v, want %q", tc.threshold, tc.replicas, err, tc.err)
		}
	}
}

// alterOf parses the flags of table alter as the command does.
func alterOf(t *testing.T, args ...string) alterFlags {
	t.Helper()
	fs := flag.NewFlagSet("alter", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var a alterFlags
	a.register(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatalf("%v: %v", args, err)
	}
	a.given(fs)
	return a
}

func TestAlterPlan(t *testing.T) {
	hot := &client.TableSpec{Name: "t", HotThreshold: 500, HotReplicas: 3}
	off := &client.TableSpec{Name: "t"}
	bounded := client.Consistency{Level: client.Bounded, Bound: 250 * time.Millisecond}
	lin := client.Consistency{Level: client.Linearizable}
	for _, tc := range []struct {
		args      []string
		needsSpec bool
		cur       *client.TableSpec
		want      alterPlan
		err       string
	}{
		{args: nil, err: "nothing to change"},
		{args: []string{"--consistency", "bounded:250ms"}, want: alterPlan{consistency: &bounded}},
		{args: []string{"--consistency", "linearizable"}, want: alterPlan{consistency: &lin}},
		{args: []string{"--hot-threshold", "1000", "--hot-replicas", "4"}, want: alterPlan{hot: true, threshold: 1000, replicas: 4}},
		// One hot flag alone keeps the table's other setting.
		{args: []string{"--hot-threshold", "2000"}, needsSpec: true, cur: hot, want: alterPlan{hot: true, threshold: 2000, replicas: 3}},
		{args: []string{"--hot-replicas", "5"}, needsSpec: true, cur: hot, want: alterPlan{hot: true, threshold: 500, replicas: 5}},
		{args: []string{"--hot-threshold", "2000"}, needsSpec: true, cur: off, want: alterPlan{hot: true, threshold: 2000}},
		// 0 given is not the same as not given: it turns hot keys off.
		{args: []string{"--hot-threshold", "0"}, needsSpec: true, cur: hot, want: alterPlan{hot: true}},
		{args: []string{"--hot-replicas", "2"}, needsSpec: true, cur: off, err: "has hot keys off"},
		{args: []string{"--hot-threshold", "0", "--hot-replicas", "2"}, err: "without a --hot-threshold"},
		{args: []string{"--hot-threshold", "-3"}, needsSpec: true, err: "want pulls a second >= 0"},
		{args: []string{"--hot-replicas", "20"}, needsSpec: true, err: "want 0..16"},
		{args: []string{"--consistency", "sometimes"}, err: "want linearizable"},
	} {
		a := alterOf(t, tc.args...)
		if got := a.needsSpec(); got != tc.needsSpec {
			t.Errorf("%v: needsSpec %v, want %v", tc.args, got, tc.needsSpec)
		}
		p, err := a.plan("t", tc.cur)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%v: error %v, want %q", tc.args, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%v: %v", tc.args, err)
			continue
		}
		if fmt.Sprint(p.consistency) != fmt.Sprint(tc.want.consistency) || p.hot != tc.want.hot || p.threshold != tc.want.threshold || p.replicas != tc.want.replicas {
			t.Errorf("%v: plan %+v, want %+v", tc.args, p, tc.want)
		}
	}
}

func TestPullOptions(t *testing.T) {
	if o, err := pullOptions("bounded:50ms", true); err != nil || len(o) != 3 {
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
