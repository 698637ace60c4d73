package localcluster

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/raftps/raftps/shard/auth"
	"github.com/raftps/raftps/shard/certs"
	"github.com/raftps/raftps/shard/client"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// A local cluster runs secure unless its server arguments say --insecure:
// Up makes a CA, a certificate per node and an admin client certificate in
// DIR/certs, and DIR/env, which points the CLI at them:
//
//	. DIR/env && raftps status

// AdminClient is the name of the client certificate Up makes for the
// local user (role admin).
const AdminClient = "admin"

// CertsDir is the cluster's certificates directory.
func (c *Cluster) CertsDir() string { return filepath.Join(c.Dir, "certs") }

// Insecure reports whether the servers run with --insecure.
func (c *Cluster) Insecure() bool {
	return slices.ContainsFunc(c.ServerArgs, func(a string) bool { return a == "--insecure" || a == "--insecure=true" })
}

// makeCA creates the cluster's CA, gossip key and admin client
// certificate, unless the cluster runs insecure; with caDir, it copies
// that directory's CA and gossip key instead of making new ones.
func (c *Cluster) makeCA(caDir string) error {
	if c.Insecure() {
		return nil
	}
	if caDir == "" {
		if _, err := certs.CreateCA(c.CertsDir(), "raftps local cluster CA", certs.Options{}); err != nil {
			return fmt.Errorf("local cluster certificates: %w", err)
		}
	} else if err := copyCA(caDir, c.CertsDir()); err != nil {
		return err
	}
	if _, err := certs.CreateClient(c.CertsDir(), AdminClient, certs.RoleAdmin, certs.Options{}); err != nil {
		return fmt.Errorf("local cluster certificates: %w", err)
	}
	return nil
}

// copyCA copies the CA and gossip key of from into dir (made 0700).
func copyCA(from, dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	for _, f := range []struct {
		name string
		mode os.FileMode
	}{{certs.CACertFile, 0o644}, {certs.CAKeyFile, 0o600}, {certs.GossipKeyFile, 0o600}} {
		b, err := os.ReadFile(filepath.Join(from, f.name))
		if err != nil {
			return fmt.Errorf("CA directory: %w", err)
		}
		if err := os.WriteFile(filepath.Join(dir, f.name), b, f.mode); err != nil {
			return err
		}
	}
	return nil
}

// makeNode creates node nd's certificate, for the cluster's host and the
// loopback names, and returns the server arguments that use it.
func (c *Cluster) makeNode(nd Node) ([]string, error) {
	if c.Insecure() {
		return nil, nil
	}
	hosts := []string{"127.0.0.1", "localhost"}
	if c.Host != "" && !slices.Contains(hosts, c.Host) {
		hosts = append(hosts, c.Host)
	}
	if _, err := certs.CreateNode(c.CertsDir(), nd.ID, hosts, certs.Options{}); err != nil && !errors.Is(err, certs.ErrExists) {
		return nil, fmt.Errorf("certificate of %s: %w", nd.ID, err)
	}
	return []string{"--certs-dir", c.CertsDir()}, nil
}

// writeEnv writes DIR/env: the cluster's addresses and the admin's
// credentials, for '. DIR/env'.
func (c *Cluster) writeEnv() error {
	lines := []string{"export RAFTPS_CLUSTER=" + strings.Join(c.Addrs(), ",")}
	if c.Insecure() {
		lines = append(lines, "export RAFTPS_INSECURE=1", "unset RAFTPS_CA RAFTPS_CERT RAFTPS_KEY RAFTPS_TOKEN")
	} else {
		f := certs.ClientFiles(c.CertsDir(), AdminClient)
		abs := func(p string) string {
			if a, err := filepath.Abs(p); err == nil {
				return a
			}
			return p
		}
		lines = append(lines, "export RAFTPS_CA="+abs(f.CA), "export RAFTPS_CERT="+abs(f.Cert), "export RAFTPS_KEY="+abs(f.Key),
			"unset RAFTPS_INSECURE RAFTPS_TOKEN")
	}
	return os.WriteFile(filepath.Join(c.Dir, "env"), []byte(strings.Join(lines, "\n")+"\n"), 0o644)
}

// DialOptions are a client's credentials for the cluster: the admin's
// client certificate, or plaintext if the servers run insecure.
func (c *Cluster) DialOptions() ([]grpc.DialOption, error) {
	if c.Insecure() {
		return []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, nil
	}
	return ClientCredentials(certs.ClientFiles(c.CertsDir(), AdminClient))
}

// ClientCredentials are the dial options of a client holding files.
func ClientCredentials(files certs.Files) ([]grpc.DialOption, error) {
	src, err := certs.NewSource(files, certs.SourceOptions{Want: certs.Identity{Kind: certs.KindClient}})
	if err != nil {
		return nil, fmt.Errorf("local cluster credentials: %w", err)
	}
	return []grpc.DialOption{grpc.WithTransportCredentials(auth.ClientCredentials(src))}, nil
}

// ClientConfig is the default client configuration of the cluster, with
// its credentials.
func (c *Cluster) ClientConfig() (client.Config, error) {
	cfg := client.DefaultConfig(c.Addrs()...)
	opts, err := c.DialOptions()
	cfg.DialOptions = append(cfg.DialOptions, opts...)
	return cfg, err
}
