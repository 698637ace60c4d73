package auth_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/raftps/raftps/shard/auth"
	"github.com/raftps/raftps/shard/certs"
)

// TestTokens: a token verifies against its record and nothing else; the
// record holds no part of the secret; refusals name the ID, never the
// secret.
func TestTokens(t *testing.T) {
	tok, rec, err := auth.NewToken("ci", certs.RoleWriter)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(tok, "rpst_"+rec.ID+"_") || len(tok) != len("rpst_")+16+1+43 {
		t.Fatalf("token %q (ID %s): not rpst_ID_SECRET", tok, rec.ID)
	}
	secret := tok[len("rpst_")+17:]
	if bytes.Contains(rec.Hash[:], []byte(secret)) || strings.Contains(rec.Name, secret) {
		t.Error("the record holds the secret")
	}
	set := auth.TokenSet{rec.ID: rec}
	p, err := auth.VerifyToken(set, tok)
	if err != nil || p.Identity != certs.ClientIdentity("ci", certs.RoleWriter) || p.TokenID != rec.ID {
		t.Fatalf("VerifyToken: %v, %v", p, err)
	}
	if p.String() != "token "+rec.ID+" of ci (writer)" {
		t.Errorf("principal %q", p)
	}

	tok2, rec2, _ := auth.NewToken("ci", certs.RoleWriter)
	if tok2 == tok || rec2.ID == rec.ID {
		t.Error("two tokens alike")
	}
	// A record's hash does not verify another ID's secret: the hash binds
	// the ID.
	moved := rec
	moved.ID = rec2.ID
	swapped := "rpst_" + rec2.ID + "_" + secret
	for what, tc := range map[string]struct {
		set auth.TokenSet
		tok string
	}{
		"an unknown ID":              {set, tok2},
		"a secret under another ID":  {auth.TokenSet{rec2.ID: moved}, swapped},
		"a truncated token":          {set, tok[:len(tok)-1]},
		"a token with a bad ID":      {set, "rpst_zzzzzzzzzzzzzzzz_" + secret},
		"no prefix":                  {set, strings.TrimPrefix(tok, "rpst_")},
		"a revoked token (no store)": {auth.TokenSet{}, tok},
	} {
		_, err := auth.VerifyToken(tc.set, tc.tok)
		if !errors.Is(err, auth.ErrUnauthenticated) {
			t.Errorf("%s: %v, want ErrUnauthenticated", what, err)
		} else if strings.Contains(err.Error(), secret[:20]) {
			t.Errorf("%s: the refusal repeats the secret: %v", what, err)
		}
	}
	if _, _, err := auth.NewToken("ci", certs.RoleNone); !errors.Is(err, certs.ErrInvalid) {
		t.Errorf("a token without a role: %v", err)
	}
}
