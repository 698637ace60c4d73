package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/raftps/raftps/shard"
	"github.com/raftps/raftps/shard/certs"
	"github.com/raftps/raftps/shard/client"
	"google.golang.org/grpc"
)

// serverTLSFlags are the server's certificate flags: a certs directory,
// or each file by itself, or --insecure.
type serverTLSFlags struct {
	certs.NodeMaterial
	insecure bool
}

func (f *serverTLSFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.Dir, "certs-dir", os.Getenv("RAFTPS_CERTS_DIR"), "directory of this node's certificates: ca.crt, node.ID.crt, node.ID.key and gossip.key, as raftps cert makes them (default $RAFTPS_CERTS_DIR)")
	fs.StringVar(&f.CA, "ca", "", "the cluster's CA certificate file (default: ca.crt in --certs-dir)")
	fs.StringVar(&f.Cert, "cert", "", "this node's certificate file (default: node.ID.crt in --certs-dir)")
	fs.StringVar(&f.Key, "key", "", "this node's key file (default: node.ID.key in --certs-dir)")
	fs.StringVar(&f.GossipKey, "gossip-key", "", "the gossip key file, one base64 key a line, the first sent with (default: gossip.key in --certs-dir)")
	fs.BoolVar(&f.insecure, "insecure", false, "serve plaintext and authenticate nobody: anyone who reaches the ports owns the cluster. For experiments only")
}

// apply opens the material into cfg (Certs and Gossip.Keys), or sets
// Insecure; without either it refuses.
func (f *serverTLSFlags) apply(cfg *shard.NodeConfig, log hclog.Logger) error {
	switch {
	case f.insecure && f.Named():
		return errors.New("--insecure with certificates: give one or the other")
	case f.insecure:
		cfg.Insecure = true
		log.Warn("INSECURE: --insecure: both listeners serve plaintext and nobody is authenticated; anyone who reaches this node's ports owns the cluster")
		return nil
	case !f.Named():
		return errors.New("no certificates: give --certs-dir (or --ca, --cert, --key and --gossip-key); create them with raftps cert, or run with --insecure")
	}
	src, keys, err := f.Load(cfg.ID, certs.SourceOptions{
		OnReload: func(err error) {
			if err != nil {
				log.Warn("certificate files changed but were not taken", "error", err)
				return
			}
			log.Info("renewed certificate files taken for new connections")
		},
		OnRefused: certs.RateLimited(time.Second, func(err error) { log.Warn("refused a TLS peer", "error", err) }),
	})
	if err != nil {
		return fmt.Errorf("%w (create them with raftps cert, or run with --insecure)", err)
	}
	cfg.Certs, cfg.Gossip.Keys = src, keys
	return nil
}

// clientTLSFlags are a client command's credentials: the CA to check the
// nodes against, and a client certificate or a token.
type clientTLSFlags struct{ client.Credentials }

func (f *clientTLSFlags) register(fs *flag.FlagSet) {
	env := client.CredentialsFromEnv()
	fs.StringVar(&f.CAFile, "ca", env.CAFile, "the cluster's CA certificate file (default $RAFTPS_CA)")
	fs.StringVar(&f.CertFile, "cert", env.CertFile, "client certificate file (default $RAFTPS_CERT)")
	fs.StringVar(&f.KeyFile, "key", env.KeyFile, "client key file (default $RAFTPS_KEY)")
	fs.StringVar(&f.Token, "token", env.Token, "bearer token, instead of a client certificate (default $RAFTPS_TOKEN)")
	fs.BoolVar(&f.Insecure, "insecure", env.Insecure, "talk plaintext to a cluster run with --insecure (default: $RAFTPS_INSECURE=1)")
}

// dialOptions are the client's transport (and token) credentials, the
// flags to give named when they are missing.
func (f *clientTLSFlags) dialOptions() ([]grpc.DialOption, error) {
	opts, err := f.DialOptions()
	for _, h := range []struct {
		err  error
		hint string
	}{
		{client.ErrInsecureWithCredentials, "--insecure with --ca, --cert or --token (or their RAFTPS_ variables)"},
		{client.ErrNoCA, "give --ca (or $RAFTPS_CA; '. DIR/env' sets it for a local cluster), or --insecure for a cluster run that way"},
		{client.ErrNoCredential, "give --cert and --key, or --token (or $RAFTPS_CERT and $RAFTPS_KEY, or $RAFTPS_TOKEN)"},
	} {
		if errors.Is(err, h.err) {
			return nil, fmt.Errorf("%w: %s", err, h.hint)
		}
	}
	return opts, err
}
