package test

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/raftps/raftps/shard/auth"
	"github.com/raftps/raftps/shard/certs"
	"github.com/raftps/raftps/shard/client"
	"github.com/raftps/raftps/test/localcluster"
	"google.golang.org/grpc"
)

// The binary clusters of this test process share one CA (cluster up
// --ca-dir), whose admin client certificate is in the environment
// (RAFTPS_CA, RAFTPS_CERT, RAFTPS_KEY): the CLI commands the tests run
// inherit it, and testClientConfig gives it to in-process clients, so
// either is credentialed for any of the clusters.

var (
	caOnce sync.Once
	caDir  string
	caErr  error
)

// testCA returns the shared CA's directory, made on first use.
func testCA(t testing.TB) string {
	t.Helper()
	caOnce.Do(func() {
		if caDir, caErr = os.MkdirTemp("", "raftps-test-ca-"); caErr != nil {
			return
		}
		if _, caErr = certs.CreateCA(caDir, "raftps test CA", certs.Options{}); caErr != nil {
			return
		}
		if _, caErr = certs.CreateClient(caDir, localcluster.AdminClient, certs.RoleAdmin, certs.Options{}); caErr != nil {
			return
		}
		f := certs.ClientFiles(caDir, localcluster.AdminClient)
		for k, v := range map[string]string{"RAFTPS_CA": f.CA, "RAFTPS_CERT": f.Cert, "RAFTPS_KEY": f.Key} {
			if caErr = os.Setenv(k, v); caErr != nil {
				return
			}
		}
		os.Unsetenv("RAFTPS_TOKEN")
		os.Unsetenv("RAFTPS_INSECURE")
	})
	if caErr != nil {
		t.Fatalf("test CA: %v", caErr)
	}
	return caDir
}

// testClientConfig is the default client configuration of the cluster
// at cluster (comma-separated client addresses), with the shared CA's
// admin credentials.
func testClientConfig(t testing.TB, cluster string) client.Config {
	t.Helper()
	cfg := client.DefaultConfig(strings.Split(cluster, ",")...)
	opts, err := localcluster.ClientCredentials(certs.ClientFiles(testCA(t), localcluster.AdminClient))
	if err != nil {
		t.Fatal(err)
	}
	cfg.DialOptions = opts
	return cfg
}

// nodeCreds are a peer's dial options for a local cluster's peer
// listeners: node id's certificate.
func nodeCreds(t testing.TB, lc *localcluster.Cluster, id string) []grpc.DialOption {
	t.Helper()
	src, err := certs.NewSource(certs.NodeFiles(lc.CertsDir(), id), certs.SourceOptions{Want: certs.NodeIdentity(id)})
	if err != nil {
		t.Fatal(err)
	}
	return []grpc.DialOption{grpc.WithTransportCredentials(auth.NodeCredentials(src, func(string) string { return "" }))}
}

func TestMain(m *testing.M) {
	code := m.Run()
	if caDir != "" && filepath.IsAbs(caDir) {
		os.RemoveAll(caDir)
	}
	os.Exit(code)
}
