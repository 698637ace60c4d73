package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestRun(t *testing.T) {
	for _, tc := range []struct {
		args       []string
		code       int
		out, errSu string
	}{
		{nil, 0, "Commands:", ""},
		{[]string{"help"}, 0, "version", ""},
		{[]string{"version"}, 0, "raftps ", ""},
		{[]string{"version", "x"}, 2, "", "takes no arguments"},
		{[]string{"frobnicate"}, 2, "", `unknown command "frobnicate"`},
	} {
		var out, errb bytes.Buffer
		if code := run(tc.args, &out, &errb); code != tc.code {
			t.Errorf("%v: exit %d, want %d", tc.args, code, tc.code)
		}
		if !strings.Contains(out.String(), tc.out) || !strings.Contains(errb.String(), tc.errSu) {
			t.Errorf("%v: stdout %q stderr %q", tc.args, out.String(), errb.String())
		}
	}
}
