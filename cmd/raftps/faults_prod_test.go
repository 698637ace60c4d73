//go:build !raftps_faultinject

package main

import (
	"bytes"
	"strings"
	"testing"
)

// A production build refuses --fault-injection, saying which build has it,
// before it opens anything.
func TestProductionBuildRefusesFaultInjection(t *testing.T) {
	var out, errb bytes.Buffer
	dir := t.TempDir()
	code := run([]string{"server", "--id", "n1", "--addr", "127.0.0.1:0", "--data-dir", dir, "--bootstrap", "--insecure", "--fault-injection"}, &out, &errb)
	if code != 1 || !strings.Contains(errb.String(), "--fault-injection: this is a production build") || !strings.Contains(errb.String(), "raftps_faultinject") {
		t.Fatalf("exit %d, stderr %q", code, errb.String())
	}
}
