package main

import (
	"bytes"
	"strings"
	"testing"
)

// Token commands check their arguments before dialing anyone.
func TestTokenUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"token"}, 2, "usage: raftps token create|list|revoke"},
		{[]string{"token", "frob"}, 2, `unknown subcommand "frob"`},
		{[]string{"token", "create", "--name", "x"}, 2, "--name and --role are required"},
		{[]string{"token", "revoke"}, 2, "usage: raftps token revoke ID|NAME"},
		{[]string{"token", "list", "extra"}, 2, "unexpected arguments"},
		{[]string{"token", "list", "--cluster", ""}, 1, "no cluster given"},
	} {
		var out, errb bytes.Buffer
		if code := run(tc.args, &out, &errb); code != tc.code || !strings.Contains(errb.String(), tc.msg) {
			t.Errorf("raftps %s: exit %d, stderr %q; want %d and %q", strings.Join(tc.args, " "), code, errb.String(), tc.code, tc.msg)
		}
	}
}
