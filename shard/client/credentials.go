package client

import (
	"errors"
	"fmt"
	"os"

	"github.com/raftps/raftps/shard/auth"
	"github.com/raftps/raftps/shard/certs"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// Credentials are what a client proves itself with to a secure cluster:
// the CA file that the nodes' certificates are checked against, and either
// a client certificate and key (files, as raftps cert create-client writes
// them) or a bearer token. Insecure talks plaintext to a cluster run with
// --insecure, and may not be combined with the others.
type Credentials struct {
	CAFile, CertFile, KeyFile string
	Token                     string
	Insecure                  bool
}

// The environment variables CredentialsFromEnv reads: the CLI's, which
// raftps cluster up writes to DIR/env.
const (
	EnvCA       = "RAFTPS_CA"
	EnvCert     = "RAFTPS_CERT"
	EnvKey      = "RAFTPS_KEY"
	EnvToken    = "RAFTPS_TOKEN"
	EnvInsecure = "RAFTPS_INSECURE" // "1": Insecure
)

// CredentialsFromEnv returns the credentials the RAFTPS_ environment
// variables name.
func CredentialsFromEnv() Credentials {
	return Credentials{
		CAFile: os.Getenv(EnvCA), CertFile: os.Getenv(EnvCert), KeyFile: os.Getenv(EnvKey),
		Token: os.Getenv(EnvToken), Insecure: os.Getenv(EnvInsecure) == "1",
	}
}

// DialOptions returns the transport (and token) credentials to add to
// Config.DialOptions. Incomplete or contradictory credentials are one of
// the ErrNoCA... errors below, wrapped. A client certificate's
// files are read again when they change, so a renewed certificate is used
// for new connections without a restart.
func (c Credentials) DialOptions() ([]grpc.DialOption, error) {
	if err := c.check(); err != nil {
		return nil, fmt.Errorf("client credentials: %w", err)
	}
	if c.Insecure {
		return []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, nil
	}
	want := certs.Identity{Kind: certs.KindClient}
	if c.CertFile == "" {
		want = certs.Identity{} // a token's caller holds the CA only
	}
	src, err := certs.NewSource(certs.Files{CA: c.CAFile, Cert: c.CertFile, Key: c.KeyFile}, certs.SourceOptions{Want: want})
	if err != nil {
		return nil, fmt.Errorf("client credentials: %w", err)
	}
	opts := []grpc.DialOption{grpc.WithTransportCredentials(auth.ClientCredentials(src))}
	if c.Token != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(auth.BearerToken(c.Token)))
	}
	return opts, nil
}

// The ways Credentials can be incomplete or contradictory.
var (
	ErrInsecureWithCredentials = errors.New("insecure with credentials: give one or the other")
	ErrNoCA                    = errors.New("no CA: the cluster's CA certificate file is needed")
	ErrCertWithoutKey          = errors.New("a certificate file and a key file go together")
	ErrNoCredential            = errors.New("no credential: a client certificate and key, or a token")
	ErrCertAndToken            = errors.New("both a client certificate and a token: give one")
)

func (c Credentials) check() error {
	switch {
	case c.Insecure && (c.CAFile != "" || c.CertFile != "" || c.KeyFile != "" || c.Token != ""):
		return ErrInsecureWithCredentials
	case c.Insecure:
		return nil
	case c.CAFile == "":
		return ErrNoCA
	case (c.CertFile == "") != (c.KeyFile == ""):
		return ErrCertWithoutKey
	case c.CertFile == "" && c.Token == "":
		return ErrNoCredential
	case c.CertFile != "" && c.Token != "":
		return ErrCertAndToken
	}
	return nil
}
