package client_test

import (
	"os/exec"
	"strings"
	"testing"
)

// serverDeps lists the packages of the server's machinery that pkg links:
// go list -deps names every package it needs, its tests' excluded.
func serverDeps(t *testing.T, pkg string) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", pkg).CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps %s: %v\n%s", pkg, err, out)
	}
	prefixes := []string{"github.com/hashicorp/raft", "github.com/hashicorp/memberlist", "go.etcd.io/bbolt",
		"github.com/boltdb/bolt", "github.com/raftps/raftps/replication"}
	var bad []string
	for _, dep := range strings.Fields(string(out)) {
		if dep == "github.com/raftps/raftps/shard" {
			bad = append(bad, dep)
			continue
		}
		for _, p := range prefixes {
			if dep == p || strings.HasPrefix(dep, p+"/") || strings.HasPrefix(dep, p+"-") {
				bad = append(bad, dep)
			}
		}
	}
	return bad
}

// TestClientStandsAlone: a program that imports the client links none of
// the server's machinery: not hashicorp/raft, raft-boltdb, bbolt,
// memberlist, nor raftps's replication or node packages.
func TestClientStandsAlone(t *testing.T) {
	if bad := serverDeps(t, "github.com/raftps/raftps/shard/client"); len(bad) > 0 {
		t.Errorf("the client depends on %v", bad)
	}
	// The check can fail: the node package has all of them.
	if bad := serverDeps(t, "github.com/raftps/raftps/shard"); len(bad) < 5 {
		t.Errorf("the node package links only %v of the server's machinery: the check above checks nothing", bad)
	}
}
