package main

import (
	"bytes"
	"flag"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/raftps/raftps/shard/shardpb"
)

func TestParseConsistency(t *testing.T) {
	for _, tc := range []struct {
		in    string
		level shardpb.Consistency
		bound time.Duration
		err   string
	}{
		{"linearizable", shardpb.Consistency_CONSISTENCY_LINEARIZABLE, 0, ""},
		{"eventual", shardpb.Consistency_CONSISTENCY_EVENTUAL, 0, ""},
		{"bounded:100ms", shardpb.Consistency_CONSISTENCY_BOUNDED, 100 * time.Millisecond, ""},
		{"bounded", 0, 0, "want bounded:DURATION"},
		{"bounded:-1s", 0, 0, "want bounded:DURATION"},
		{"strong", 0, 0, "want linearizable, bounded:DURATION or eventual"},
	} {
		level, bound, err := parseConsistency(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: error %v, want %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || level != tc.level || bound != tc.bound {
			t.Errorf("%q: %v %v %v, want %v %v", tc.in, level, bound, err, tc.level, tc.bound)
		}
		if tc.level == shardpb.Consistency_CONSISTENCY_BOUNDED {
			if got := consistencyName(level, int64(bound)); got != tc.in {
				t.Errorf("consistencyName of %q = %q", tc.in, got)
			}
		}
	}
}

func TestHotSetting(t *testing.T) {
	for _, tc := range []struct {
		threshold float64
		replicas  uint32
		want      string
	}{
		{0, 0, "off"},
		{1000, 2, ">= 1000 pulls/s, 2 read replicas"},
		{12.5, 1, ">= 12.5 pulls/s, 1 read replica"},
	} {
		if got := hotSetting(&shardpb.TableSpec{HotThreshold: tc.threshold, HotReplicas: tc.replicas}); got != tc.want {
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

func TestAlterRequest(t *testing.T) {
	hot := &shardpb.TableSpec{Name: "t", HotThreshold: 500, HotReplicas: 3}
	off := &shardpb.TableSpec{Name: "t"}
	for _, tc := range []struct {
		args      []string
		needsSpec bool
		cur       *shardpb.TableSpec
		want      *shardpb.AlterTableRequest
		err       string
	}{
		{args: nil, err: "nothing to change"},
		{args: []string{"--consistency", "bounded:250ms"},
			want: &shardpb.AlterTableRequest{Name: "t", Consistency: shardpb.Consistency_CONSISTENCY_BOUNDED, StalenessBoundNs: int64(250 * time.Millisecond)}},
		{args: []string{"--consistency", "linearizable"},
			want: &shardpb.AlterTableRequest{Name: "t", Consistency: shardpb.Consistency_CONSISTENCY_LINEARIZABLE}},
		{args: []string{"--hot-threshold", "1000", "--hot-replicas", "4"},
			want: &shardpb.AlterTableRequest{Name: "t", SetHot: true, HotThreshold: 1000, HotReplicas: 4}},
		// One hot flag alone keeps the table's other setting.
		{args: []string{"--hot-threshold", "2000"}, needsSpec: true, cur: hot,
			want: &shardpb.AlterTableRequest{Name: "t", SetHot: true, HotThreshold: 2000, HotReplicas: 3}},
		{args: []string{"--hot-replicas", "5"}, needsSpec: true, cur: hot,
			want: &shardpb.AlterTableRequest{Name: "t", SetHot: true, HotThreshold: 500, HotReplicas: 5}},
		{args: []string{"--hot-threshold", "2000"}, needsSpec: true, cur: off,
			want: &shardpb.AlterTableRequest{Name: "t", SetHot: true, HotThreshold: 2000}},
		// 0 given is not the same as not given: it turns hot keys off.
		{args: []string{"--hot-threshold", "0"}, needsSpec: true, cur: hot,
			want: &shardpb.AlterTableRequest{Name: "t", SetHot: true}},
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
		req, err := a.request("t", tc.cur)
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
		if req.String() != tc.want.String() {
			t.Errorf("%v: request {%v}, want {%v}", tc.args, req, tc.want)
		}
	}
}

func TestPullOptions(t *testing.T) {
	o, err := pullOptions("bounded:50ms", true)
	if err != nil || o.Level != shardpb.Consistency_CONSISTENCY_BOUNDED || o.StalenessBound != 50*time.Millisecond || !o.AllowWeaker {
		t.Errorf("bounded:50ms --allow-weaker: %+v %v", o, err)
	}
	o, err = pullOptions("", false)
	if err != nil || o.Level != shardpb.Consistency_CONSISTENCY_UNSPECIFIED || o.StalenessBound != 0 || o.AllowWeaker {
		t.Errorf("no flags: %+v %v", o, err)
	}
	if _, err := pullOptions("bounded:", false); err == nil {
		t.Error("bounded: without a duration: no error")
	}
}

func TestPrintDescribe(t *testing.T) {
	d := &shardpb.DescribeTableResponse{
		Spec: &shardpb.TableSpec{Name: "users", Dim: 8, Shards: 2, Replicas: 3, Replication: "raft", Optimizer: "adagrad", Initializer: "zeros",
			Consistency: shardpb.Consistency_CONSISTENCY_BOUNDED, StalenessBoundNs: int64(100 * time.Millisecond), HotThreshold: 1000, HotReplicas: 2},
		Leaders: []*shardpb.ShardLeader{{Shard: 0, LeaderId: "n1", LeaderAddr: "127.0.0.1:7001"}, {Shard: 1}},
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
	for _, s := range []string{`"consistency": "bounded:100ms"`, `"hot_threshold": 1000`, `"hot_replicas": 2`, `"leader": "n1"`} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("describe --json lacks %s:\n%s", s, out.String())
		}
	}
}
