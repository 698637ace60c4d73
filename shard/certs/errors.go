package certs

import "errors"

// The errors of this package. Every error it returns wraps one of them and
// names the file, name or value at fault.
var (
	// ErrInvalid: a name, role, host or lifetime that cannot go into a
	// certificate.
	ErrInvalid = errors.New("invalid certificate request")
	// ErrExists: a file would be overwritten and overwriting was not asked for.
	ErrExists = errors.New("file exists")
	// ErrNoCA: the certs directory holds no CA (ca.crt and ca.key) to sign with.
	ErrNoCA = errors.New("no certificate authority")
	// ErrMaterial: a certificate, key or gossip key file that cannot be used:
	// unreadable, not PEM, a key that does not match its certificate, a
	// certificate the CA did not sign, or the wrong identity.
	ErrMaterial = errors.New("unusable certificate material")
	// ErrNoIdentity: a certificate without a well-formed raftps identity.
	ErrNoIdentity = errors.New("no raftps identity")
	// ErrRefused: a TLS peer whose certificate does not prove what the
	// connection needs (the wrong kind of identity, another node than the
	// one dialed, no certificate at all).
	ErrRefused = errors.New("peer certificate refused")
)
