package main

import (
	"bytes"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestHealth(t *testing.T) {
	ok := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthz" {
			http.NotFound(w, r)
			return
		}
		w.Write([]byte("ok\n"))
	}))
	defer ok.Close()
	sick := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "no metadata leader", http.StatusServiceUnavailable)
	}))
	defer sick.Close()
	// An address nothing listens on: bind a port, then free it.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := l.Addr().String()
	l.Close()

	for _, tc := range []struct {
		args       []string
		code       int
		out, errSu string
	}{
		{[]string{"health", "--http", strings.TrimPrefix(ok.URL, "http://")}, 0, ": ok", ""},
		{[]string{"health", "--http", strings.TrimPrefix(sick.URL, "http://")}, 1, "", "unhealthy: 503 Service Unavailable: no metadata leader"},
		{[]string{"health", "--http", dead}, 1, "", "raftps health: " + dead + ": no answer:"},
		{[]string{"health", "extra"}, 2, "", "takes no arguments"},
	} {
		var out, errb bytes.Buffer
		if code := run(tc.args, &out, &errb); code != tc.code {
			t.Errorf("%v: exit %d, want %d (stderr %q)", tc.args, code, tc.code, errb.String())
		}
		if !strings.Contains(out.String(), tc.out) || !strings.Contains(errb.String(), tc.errSu) {
			t.Errorf("%v: stdout %q stderr %q", tc.args, out.String(), errb.String())
		}
	}
}
