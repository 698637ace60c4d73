package netfault

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/raftps/raftps/shard/internal/loopback"
)

// TestNetFaultBlocksAndHeals: a connection open to a peer is closed when the
// peer is blocked, a new dial hangs until its deadline (as a connect into a
// partition does), and after healing dials work again. Peers not blocked
// are untouched throughout.
func TestNetFaultBlocksAndHeals(t *testing.T) {
	a, aIn := loopback.AcceptAll(t)
	b, _ := loopback.AcceptAll(t)
	f := New()
	ctx := context.Background()
	ca, err := f.Dial(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	cb, err := f.Dial(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	peerSide := <-aIn

	f.Block([]string{a})
	// The open connection to a is closed: a sees EOF, our side fails.
	peerSide.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := peerSide.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("peer side of a blocked connection read %v, want EOF", err)
	}
	if _, err := ca.Write([]byte("x")); err == nil {
		t.Fatal("write on a connection to a blocked peer succeeded")
	}
	// b's connection still works.
	if _, err := cb.Write([]byte("x")); err != nil {
		t.Fatalf("connection to an unblocked peer broke: %v", err)
	}
	// A new dial to a hangs until its deadline, then fails.
	dctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := f.Dial(dctx, a); !errors.Is(err, ErrBlackholed) {
		t.Fatalf("dial to a blocked peer: %v, want ErrBlackholed", err)
	}
	if time.Since(start) < 150*time.Millisecond {
		t.Fatal("dial to a blocked peer failed at once; a partition makes it hang")
	}

	f.Block(nil)
	c, err := f.Dial(ctx, a)
	if err != nil {
		t.Fatalf("dial after healing: %v", err)
	}
	c.Close()
}

// TestNetFaultHTTP: the endpoint replaces the blocked set, shows it, and
// refuses addresses that are not host:port without changing anything.
func TestNetFaultHTTP(t *testing.T) {
	f := New()
	srv := httptest.NewServer(f)
	defer srv.Close()
	post := func(block string) (int, string) {
		resp, err := http.PostForm(srv.URL, url.Values{"block": {block}})
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := post("127.0.0.1:1,127.0.0.1:2"); code != 200 || !strings.Contains(body, `"127.0.0.1:2"`) {
		t.Fatalf("POST: %d %s", code, body)
	}
	if code, body := post("127.0.0.1:3,nonsense"); code != 400 || !strings.Contains(body, "nonsense") {
		t.Fatalf("POST with a bad address: %d %s, want 400 naming it", code, body)
	}
	if !f.Blocked("127.0.0.1:1") || f.Blocked("127.0.0.1:3") {
		t.Fatalf("a refused request changed the blocked set: %v", f.BlockedList())
	}
	if code, _ := post(""); code != 200 || len(f.BlockedList()) != 0 {
		t.Fatalf("POST block= should clear the set: %d %v", code, f.BlockedList())
	}
}
