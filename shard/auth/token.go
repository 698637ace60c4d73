package auth

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/raftps/raftps/shard/certs"
	"google.golang.org/grpc/credentials"
)

// Bearer tokens, for tools that cannot hold a certificate.
//
// A token is "rpst_" + ID + "_" + secret: ID is 16 hex digits (64 random
// bits) that find the token's record, the secret 43 base64url characters
// (256 random bits). The cluster keeps only the record (TokenRecord): ID,
// name, role and the SHA-256 of the secret, so that a copy of the metadata
// (a snapshot, a backup, a node's disk) holds no usable token.
//
// A plain SHA-256 is enough: slow password hashes (bcrypt, argon2) exist
// to make guessing low-entropy passwords expensive, and nobody guesses 256
// random bits. A slow hash would cost every RPC that presents a token
// instead. The hash is compared in constant time, so the time of a refusal
// says nothing about how much of a guess matched.
const (
	tokenPrefix    = "rpst_"
	tokenIDBytes   = 8
	tokenKeyBytes  = 32
	tokenHashLabel = "raftps token v1\x00"
)

// TokenRecord is what the cluster stores of a token.
type TokenRecord struct {
	ID   string
	Name string
	Role certs.Role
	Hash [sha256.Size]byte
}

// TokenStore finds token records by ID. The metadata group is the store of
// a cluster (the records replicated through its log). Token must be safe
// for concurrent use: every call that presents a token asks it.
type TokenStore interface {
	Token(id string) (TokenRecord, bool)
}

// TokenSet is a TokenStore in memory, by ID.
type TokenSet map[string]TokenRecord

// Token returns the record of id.
func (s TokenSet) Token(id string) (TokenRecord, bool) {
	r, ok := s[id]
	return r, ok
}

// NewToken makes a token for name with role: the token, to give to its
// user once, and the record to store.
func NewToken(name string, role certs.Role) (string, TokenRecord, error) {
	if err := certs.ClientIdentity(name, role).Check(); err != nil {
		return "", TokenRecord{}, fmt.Errorf("token: %w", err)
	}
	b := make([]byte, tokenIDBytes+tokenKeyBytes)
	if _, err := rand.Read(b); err != nil {
		return "", TokenRecord{}, fmt.Errorf("token: %w", err)
	}
	id, secret := hex.EncodeToString(b[:tokenIDBytes]), base64.RawURLEncoding.EncodeToString(b[tokenIDBytes:])
	return tokenPrefix + id + "_" + secret, TokenRecord{ID: id, Name: name, Role: role, Hash: tokenHash(id, secret)}, nil
}

// tokenHash binds the secret to its ID, so a record's hash is no use
// under another ID.
func tokenHash(id, secret string) [sha256.Size]byte {
	return sha256.Sum256([]byte(tokenHashLabel + id + "\x00" + secret))
}

// parseToken splits a token into its ID and secret.
func parseToken(tok string) (id, secret string, err error) {
	rest, ok := strings.CutPrefix(tok, tokenPrefix)
	if ok {
		id, secret, ok = strings.Cut(rest, "_")
	}
	if !ok || len(id) != 2*tokenIDBytes || len(secret) != base64.RawURLEncoding.EncodedLen(tokenKeyBytes) {
		return "", "", fmt.Errorf("not a raftps token (rpst_ID_SECRET)")
	}
	if _, err := hex.DecodeString(id); err != nil {
		return "", "", fmt.Errorf("not a raftps token: bad ID")
	}
	return id, secret, nil
}

// VerifyToken returns the principal a token authenticates, or an
// Unauthenticated error that names the token's ID, never its secret.
func VerifyToken(store TokenStore, tok string) (Principal, error) {
	id, secret, err := parseToken(tok)
	if err != nil {
		return Principal{}, unauthenticated("bearer token: " + err.Error())
	}
	rec, ok := store.Token(id)
	h := tokenHash(id, secret)
	// Hash and compare whether or not the ID is known, so the time of a
	// refusal does not tell which IDs exist.
	if subtle.ConstantTimeCompare(h[:], rec.Hash[:]) != 1 || !ok {
		return Principal{}, unauthenticated(fmt.Sprintf("bearer token %s is not valid (unknown, revoked or mistyped)", id))
	}
	return Principal{Identity: certs.ClientIdentity(rec.Name, rec.Role), TokenID: id}, nil
}

// BearerToken returns call credentials that send tok with every call, as
// "authorization: Bearer TOKEN" metadata. They refuse to be sent over a
// connection without transport security.
func BearerToken(tok string) credentials.PerRPCCredentials { return bearer(tok) }

type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}

func (bearer) RequireTransportSecurity() bool { return true }

// Check returns an error unless r is a record NewToken could have made: an
// ID of 16 hex digits and a well-formed client identity. The hash is any
// 32 bytes.
func (r TokenRecord) Check() error {
	if len(r.ID) != 2*tokenIDBytes || strings.ToLower(r.ID) != r.ID {
		return fmt.Errorf("token record: ID %q: want %d lowercase hex digits", r.ID, 2*tokenIDBytes)
	}
	if _, err := hex.DecodeString(r.ID); err != nil {
		return fmt.Errorf("token record: ID %q: want %d lowercase hex digits", r.ID, 2*tokenIDBytes)
	}
	if err := certs.ClientIdentity(r.Name, r.Role).Check(); err != nil {
		return fmt.Errorf("token record %s: %w", r.ID, err)
	}
	return nil
}
