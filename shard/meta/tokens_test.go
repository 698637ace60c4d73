package meta

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/raftps/raftps/shard/api"
	"github.com/raftps/raftps/shard/auth"
	"github.com/raftps/raftps/shard/certs"
	"github.com/raftps/raftps/shard/shardpb"
	"github.com/raftps/raftps/store"
	"google.golang.org/protobuf/proto"
)

func newToken(t *testing.T, name string, role certs.Role) (string, *shardpb.MetaToken) {
	t.Helper()
	tok, rec, err := auth.NewToken(name, role)
	if err != nil {
		t.Fatal(err)
	}
	return tok, TokenRecordProto(rec)
}

func wantErr(t *testing.T, what string, out any, want error) {
	t.Helper()
	if err, ok := out.(error); !ok || !errors.Is(err, want) {
		t.Fatalf("%s: answered %v, want %v", what, out, want)
	}
}

// A stored record verifies its token through the FSM (the node's token
// store), until it is revoked, by ID or by name; the answers never carry
// the hash.
func TestTokenPutVerifyDelete(t *testing.T) {
	l := newMetaLog(t)
	tokA, recA := newToken(t, "ci", certs.RoleWriter)
	tokB, recB := newToken(t, "dash", certs.RoleReader)
	for _, r := range []*shardpb.MetaToken{recA, recB} {
		out := l.apply(CmdPutToken, &shardpb.MetaPutToken{Token: r})
		if info, ok := out.(*shardpb.TokenInfo); !ok || info.Id != r.Id || info.Name != r.Name || info.Role != r.Role {
			t.Fatalf("put %s: answered %v", r.Name, out)
		}
	}
	p, err := auth.VerifyToken(l.m, tokA)
	if err != nil || p.Name != "ci" || p.Role != certs.RoleWriter {
		t.Fatalf("token of ci: %v, %v", p, err)
	}
	if got := l.m.Tokens(); len(got) != 2 || got[0].Name != "ci" || got[1].Name != "dash" {
		t.Fatalf("Tokens: %v", got)
	}

	if out := l.apply(CmdDeleteToken, &shardpb.MetaDeleteToken{Token: recA.Id}); out.(*shardpb.TokenInfo).Name != "ci" {
		t.Fatalf("revoking by ID: %v", out)
	}
	if _, err := auth.VerifyToken(l.m, tokA); !errors.Is(err, auth.ErrUnauthenticated) {
		t.Fatalf("a revoked token: %v", err)
	}
	if out := l.apply(CmdDeleteToken, &shardpb.MetaDeleteToken{Token: "dash"}); out.(*shardpb.TokenInfo).Id != recB.Id {
		t.Fatalf("revoking by name: %v", out)
	}
	if _, err := auth.VerifyToken(l.m, tokB); err == nil {
		t.Fatal("a token revoked by name still verifies")
	}
	wantErr(t, "revoking again", l.apply(CmdDeleteToken, &shardpb.MetaDeleteToken{Token: "dash"}), api.ErrUnknownToken)
	if got := l.m.Tokens(); len(got) != 0 {
		t.Fatalf("Tokens after revoking both: %v", got)
	}
}

// A record NewToken could not have made, a repeated ID or name, or one over
// the quota is refused and changes nothing.
func TestTokenBadRecordsRefused(t *testing.T) {
	l := newMetaLog(t)
	_, good := newToken(t, "ci", certs.RoleAdmin)
	if out := l.apply(CmdPutToken, &shardpb.MetaPutToken{Token: good}); out == nil {
		t.Fatalf("put: %v", out)
	} else if err, ok := out.(error); ok {
		t.Fatalf("put: %v", err)
	}
	before := snapshotBytes(t, l.m)
	mod := func(f func(r *shardpb.MetaToken)) *shardpb.MetaToken {
		_, r := newToken(t, "other", certs.RoleReader)
		f(r)
		return r
	}
	for what, c := range map[string]struct {
		r    *shardpb.MetaToken
		want error
	}{
		"no record":     {nil, api.ErrBadRequest},
		"short hash":    {mod(func(r *shardpb.MetaToken) { r.Hash = r.Hash[:31] }), api.ErrBadRequest},
		"no role":       {mod(func(r *shardpb.MetaToken) { r.Role = "" }), api.ErrBadRequest},
		"unknown role":  {mod(func(r *shardpb.MetaToken) { r.Role = "root" }), api.ErrBadRequest},
		"bad ID":        {mod(func(r *shardpb.MetaToken) { r.Id = "xyz" }), api.ErrBadRequest},
		"uppercase ID":  {mod(func(r *shardpb.MetaToken) { r.Id = "ABCDEF0123456789" }), api.ErrBadRequest},
		"bad name":      {mod(func(r *shardpb.MetaToken) { r.Name = "../x" }), api.ErrBadRequest},
		"empty name":    {mod(func(r *shardpb.MetaToken) { r.Name = "" }), api.ErrBadRequest},
		"repeated ID":   {mod(func(r *shardpb.MetaToken) { r.Id = good.Id }), api.ErrTokenExists},
		"repeated name": {mod(func(r *shardpb.MetaToken) { r.Name = good.Name }), api.ErrTokenExists},
	} {
		wantErr(t, what, l.apply(CmdPutToken, &shardpb.MetaPutToken{Token: c.r}), c.want)
	}
	_, r := newToken(t, "one-too-many", certs.RoleReader)
	wantErr(t, "over the quota", l.apply(CmdPutToken, &shardpb.MetaPutToken{Token: r, MaxTokens: 1}), api.ErrQuotaExceeded)
	wantErr(t, "revoking nothing", l.apply(CmdDeleteToken, &shardpb.MetaDeleteToken{}), api.ErrUnknownToken)
	if after := snapshotBytes(t, l.m); !bytes.Equal(before, after) {
		t.Fatal("a refused token command changed the state")
	}
}

// Tokens survive a snapshot round trip; two replicas that applied the same
// commands in the same order write the same snapshot bytes; a snapshot with
// a bad record is refused whole.
func TestTokenSnapshot(t *testing.T) {
	a, b := newMetaLog(t), newMetaLog(t)
	var toks []string
	for _, name := range []string{"zeta", "alpha", "mid"} {
		tok, r := newToken(t, name, certs.RoleReader)
		toks = append(toks, tok)
		a.apply(CmdPutToken, &shardpb.MetaPutToken{Token: r})
		b.apply(CmdPutToken, &shardpb.MetaPutToken{Token: r})
	}
	a.apply(CmdDeleteToken, &shardpb.MetaDeleteToken{Token: "mid"})
	b.apply(CmdDeleteToken, &shardpb.MetaDeleteToken{Token: "mid"})
	snap := snapshotBytes(t, a.m)
	if !bytes.Equal(snap, snapshotBytes(t, b.m)) {
		t.Fatal("two replicas of the same log wrote different snapshots")
	}
	c := New(func() {})
	if err := restore(c, snap); err != nil {
		t.Fatal(err)
	}
	for i, tok := range toks {
		_, err := auth.VerifyToken(c, tok)
		if revoked := i == 2; (err == nil) == revoked {
			t.Fatalf("token %d after a restore: %v (revoked %v)", i, err, revoked)
		}
	}
	if !bytes.Equal(snap, snapshotBytes(t, c)) {
		t.Fatal("a restored replica writes another snapshot")
	}

	state := &shardpb.MetaSnapshot{}
	if err := proto.Unmarshal(snap[8:], state); err != nil {
		t.Fatal(err)
	}
	state.Tokens[0].Hash = nil
	bad := binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(nil, snapshotMarker), snapshotFormat)
	bad, err := deterministic.MarshalAppend(bad, state)
	if err != nil {
		t.Fatal(err)
	}
	if err := restore(c, bad); !errors.Is(err, store.ErrCorruptSnapshot) {
		t.Fatalf("restoring a snapshot with a bad record: %v", err)
	}
	if _, err := auth.VerifyToken(c, toks[0]); err != nil {
		t.Fatalf("a refused restore changed the state: %v", err)
	}
}
