package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestChaosFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "--target is required"},
		{[]string{"--target", "nowhere"}, "want local:DIR"},
		{[]string{"--target", "ftp:x"}, "unknown kind"},
		{[]string{"--target", "local:/nonexistent/raftps"}, "cluster.json"},
		{[]string{"--target", "local:x", "--faults", "kill-leader,flood"}, `unknown fault "flood"`},
		{[]string{"--target", "local:x", "--down", "10s", "--every", "10s"}, "Down (10s) must be shorter than Every (10s)"},
		{[]string{"--target", "local:x", "--clients", "0"}, "must be positive"},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(append([]string{"chaos"}, tc.args...), &stdout, &stderr); code != 1 || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("chaos %v: exit %d, stderr %q; want exit 1 and %q", tc.args, code, stderr.String(), tc.want)
		}
	}
}
