package auth_test

import (
	"os/exec"
	"strings"
	"testing"
)

// nonStandardDeps lists the packages outside the standard library that pkg
// links (its tests' excluded).
func nonStandardDeps(t *testing.T, pkg string) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", pkg).CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps %s: %v\n%s", pkg, err, out)
	}
	return strings.Fields(string(out))
}

// TestLinksNoServer: the Go client will load its certificates with
// shard/certs and send tokens with shard/auth, so neither may pull in the
// server's machinery (shard/client's TestClientStandsAlone forbids it);
// certs links the standard library only.
func TestLinksNoServer(t *testing.T) {
	if deps := nonStandardDeps(t, "github.com/raftps/raftps/shard/certs"); len(deps) != 1 {
		t.Errorf("shard/certs links %v besides the standard library", deps)
	}
	deps := nonStandardDeps(t, "github.com/raftps/raftps/shard/auth")
	for _, d := range deps {
		for _, bad := range []string{"github.com/hashicorp/", "go.etcd.io/bbolt", "github.com/boltdb/", "github.com/raftps/raftps/replication"} {
			if strings.HasPrefix(d, bad) || d == "github.com/raftps/raftps/shard" {
				t.Errorf("shard/auth links %s", d)
			}
		}
	}
	if len(deps) < 3 {
		t.Errorf("shard/auth links only %v: the check above checks nothing", deps)
	}
}
