package meta

import (
	"crypto/sha256"
	"fmt"
	"slices"
	"strings"

	"github.com/raftps/raftps/shard/api"
	"github.com/raftps/raftps/shard/auth"
	"github.com/raftps/raftps/shard/certs"
	"github.com/raftps/raftps/shard/shardpb"
	"github.com/raftps/raftps/store"
	"google.golang.org/protobuf/proto"
)

// Bearer tokens' records (shard/auth, token.go): the metadata group is the
// cluster's auth.TokenStore. Every node's client gate reads its own
// replica's records (Token), so a revocation is in force on a node once
// its replica has applied it.
//
// Numbered apart from the other commands, which other work extends.
const (
	CmdPutToken    byte = 60 // a *shardpb.MetaPutToken
	CmdDeleteToken byte = 61 // a *shardpb.MetaDeleteToken
)

// TokenRecordProto is the stored form of a token's record.
func TokenRecordProto(r auth.TokenRecord) *shardpb.MetaToken {
	return &shardpb.MetaToken{Id: r.ID, Name: r.Name, Role: r.Role.String(), Hash: r.Hash[:]}
}

// tokenRecord decodes a stored record, refusing one NewToken could not
// have made (a bad ID, name or role, a hash of the wrong size).
func tokenRecord(t *shardpb.MetaToken) (auth.TokenRecord, error) {
	if t == nil {
		return auth.TokenRecord{}, fmt.Errorf("meta: %w: token command without a record", api.ErrBadRequest)
	}
	role, err := certs.ParseRole(t.Role)
	if err != nil {
		return auth.TokenRecord{}, fmt.Errorf("meta: %w: token %q: %w", api.ErrBadRequest, t.Id, err)
	}
	r := auth.TokenRecord{ID: t.Id, Name: t.Name, Role: role}
	if len(t.Hash) != sha256.Size {
		return r, fmt.Errorf("meta: %w: token %q: hash of %d bytes, want %d", api.ErrBadRequest, t.Id, len(t.Hash), sha256.Size)
	}
	copy(r.Hash[:], t.Hash)
	if err := r.Check(); err != nil {
		return r, fmt.Errorf("meta: %w: %w", api.ErrBadRequest, err)
	}
	return r, nil
}

// CheckTokenRecord refuses what the state machine would refuse of a record
// whatever the state: for the leader to check a forwarded record before
// proposing it.
func CheckTokenRecord(t *shardpb.MetaToken) error {
	_, err := tokenRecord(t)
	return err
}

func (m *FSM) applyPutToken(arg []byte) any {
	c := &shardpb.MetaPutToken{}
	if err := proto.Unmarshal(arg, c); err != nil {
		return fmt.Errorf("meta: decoding token record: %w", err)
	}
	if _, err := tokenRecord(c.Token); err != nil {
		return err
	}
	t := c.Token
	m.mu.Lock()
	defer m.mu.Unlock()
	if max := c.MaxTokens; max > 0 && len(m.tokens) >= int(max) {
		return fmt.Errorf("%w: token %q: the cluster holds %d tokens, its limit of tokens is %d; revoke one", api.ErrQuotaExceeded, t.Name, len(m.tokens), max)
	}
	if _, ok := m.tokens[t.Id]; ok {
		return fmt.Errorf("%w: a token with ID %s exists", api.ErrTokenExists, t.Id)
	}
	if old := m.tokenNamedLocked(t.Name); old != nil {
		return fmt.Errorf("%w: a token named %q exists (ID %s): revoke it first", api.ErrTokenExists, t.Name, old.Id)
	}
	if m.tokens == nil {
		m.tokens = map[string]*shardpb.MetaToken{}
	}
	m.tokens[t.Id] = t
	return TokenInfo(t)
}

// tokenNamedLocked is the token named name, or nil. m.mu must be held.
// Names are unique, so at most one matches; a linear scan, since a
// cluster holds few tokens and names are looked up only to revoke.
func (m *FSM) tokenNamedLocked(name string) *shardpb.MetaToken {
	for _, t := range m.tokens {
		if t.Name == name {
			return t
		}
	}
	return nil
}

// applyDeleteToken revokes a token by ID or, failing that, by name. IDs
// are hex digits and names may be too, so the ID is tried first: a name
// that is also another token's ID cannot shadow it.
func (m *FSM) applyDeleteToken(arg []byte) any {
	c := &shardpb.MetaDeleteToken{}
	if err := proto.Unmarshal(arg, c); err != nil {
		return fmt.Errorf("meta: decoding token revocation: %w", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	t, ok := m.tokens[c.Token]
	if !ok {
		t = m.tokenNamedLocked(c.Token)
	}
	if t == nil {
		return fmt.Errorf("token %q: %w", c.Token, api.ErrUnknownToken)
	}
	delete(m.tokens, t.Id)
	return TokenInfo(t)
}

// TokenInfo is what may be shown of a stored record: not its hash.
func TokenInfo(t *shardpb.MetaToken) *shardpb.TokenInfo {
	return &shardpb.TokenInfo{Id: t.Id, Name: t.Name, Role: t.Role}
}

// Token returns the record of the token id: the FSM is the node's
// auth.TokenStore. Safe for concurrent use.
func (m *FSM) Token(id string) (auth.TokenRecord, bool) {
	m.mu.RLock()
	t, ok := m.tokens[id]
	m.mu.RUnlock()
	if !ok {
		return auth.TokenRecord{}, false
	}
	// Stored records passed tokenRecord on apply or restore.
	r, err := tokenRecord(t)
	return r, err == nil
}

// Tokens returns what may be shown of every token, sorted by name.
func (m *FSM) Tokens() []*shardpb.TokenInfo {
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := make([]*shardpb.TokenInfo, 0, len(m.tokens))
	for _, t := range m.tokens {
		out = append(out, TokenInfo(t))
	}
	slices.SortFunc(out, func(a, b *shardpb.TokenInfo) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// tokensByID indexes a snapshot's records, refusing a bad one: a snapshot
// is another replica's state, and a record Token could not decode would be
// a token nobody can use or revoke by name.
func tokensByID(list []*shardpb.MetaToken) (map[string]*shardpb.MetaToken, error) {
	out := make(map[string]*shardpb.MetaToken, len(list))
	for _, t := range list {
		if _, err := tokenRecord(t); err != nil {
			return nil, fmt.Errorf("meta: %w: %w", store.ErrCorruptSnapshot, err)
		}
		if _, dup := out[t.Id]; dup {
			return nil, fmt.Errorf("meta: %w: token %s twice", store.ErrCorruptSnapshot, t.Id)
		}
		out[t.Id] = t
	}
	return out, nil
}
