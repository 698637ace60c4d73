package certs_test

import (
	"crypto/tls"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/raftps/raftps/shard/certs"
	"github.com/raftps/raftps/shard/certs/certstest"
)

// serve accepts TLS connections on a loopback port with cfg until the test
// ends. After a handshake it writes the identity the peer's certificate
// proved (or "-") and closes; it sends handshake errors to errs.
type server struct {
	addr string
	errs chan error
}

func serve(t *testing.T, cfg *tls.Config) *server {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &server{addr: lis.Addr().String(), errs: make(chan error, 100)}
	var wg sync.WaitGroup
	t.Cleanup(func() { lis.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				tc := tls.Server(c, cfg)
				if err := tc.Handshake(); err != nil {
					s.errs <- err
					return
				}
				who := "-"
				if id, err := certs.VerifiedIdentity(tc.ConnectionState()); err == nil {
					who = id.String()
				}
				tc.Write([]byte(who + "\n"))
			})
		}
	})
	return s
}

// nextErr waits for the server's next handshake error (nil: none within
// 5 s). The client may see a refusal before the server has recorded it.
func (s *server) nextErr() error {
	select {
	case err := <-s.errs:
		return err
	case <-time.After(5 * time.Second):
		return nil
	}
}

// dial connects to s with cfg and returns what the server
// said the client is, and the server's certificate's CN. In TLS 1.3 the
// client's handshake ends before the server has checked the client's
// certificate, so a refusal shows on the first read.
func dial(s *server, cfg *tls.Config) (who, serverCN string, err error) {
	c, err := net.DialTimeout("tcp", s.addr, 5*time.Second)
	if err != nil {
		return "", "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	tc := tls.Client(c, cfg)
	if err := tc.Handshake(); err != nil {
		return "", "", err
	}
	serverCN = tc.ConnectionState().PeerCertificates[0].Subject.CommonName
	buf := make([]byte, 256)
	n, err := tc.Read(buf)
	if err != nil {
		return "", serverCN, err
	}
	return strings.TrimSpace(string(buf[:n])), serverCN, nil
}

// TestPeerListener: the peer listener admits nodes of its CA only: a
// client certificate, another CA's node, an expired node certificate and
// no certificate are refused; a node is admitted and the server sees its ID.
func TestPeerListener(t *testing.T) {
	d := certstest.New(t)
	var refused []error
	var mu sync.Mutex
	srcN1, err := certs.NewSource(d.Node("n1"), certs.SourceOptions{Want: certs.NodeIdentity("n1"),
		OnRefused: func(err error) { mu.Lock(); refused = append(refused, err); mu.Unlock() }})
	if err != nil {
		t.Fatal(err)
	}
	srv := serve(t, srcN1.PeerListenerConfig())
	n2 := certstest.Source(t, d.Node("n2"), certs.Identity{Kind: certs.KindNode})

	who, cn, err := dial(srv, n2.DialConfig("127.0.0.1", ""))
	if err != nil || who != "node n2" || cn != "n1" {
		t.Fatalf("node n2 to n1's peer listener: %q (server %q), %v", who, cn, err)
	}

	other := certstest.New(t)
	for _, tc := range []struct {
		what      string
		cfg       *tls.Config
		serverErr string
	}{
		{"a client certificate", certstest.Source(t, d.Client("trainer", certs.RoleAdmin), certs.Identity{}).DialConfig("127.0.0.1", ""), "client trainer (admin) may not use the peer listener"},
		{"another CA's node", certstest.Presenting(other.Node("n2")), "unknown authority"},
		{"an expired node certificate", certstest.Presenting(d.NodeValid("n3", certstest.Expired())), "expired"},
		{"no certificate", certstest.Source(t, d.CAOnly(), certs.Identity{}).DialConfig("127.0.0.1", ""), "didn't provide a certificate"},
	} {
		t.Run(tc.what, func(t *testing.T) {
			who, _, err := dial(srv, tc.cfg)
			if err == nil {
				t.Fatalf("admitted as %q", who)
			}
			if serr := srv.nextErr(); serr == nil || !strings.Contains(serr.Error(), tc.serverErr) {
				t.Errorf("server's handshake error %v, want one saying %q", serr, tc.serverErr)
			}
		})
	}
	mu.Lock()
	defer mu.Unlock()
	if len(refused) != 1 || !errors.Is(refused[0], certs.ErrRefused) {
		t.Errorf("OnRefused got %v, want the client certificate's refusal only (the others fail Go's checks first)", refused)
	}
}

// TestClientListener: a client certificate is optional on the client
// listener, and verified when given.
func TestClientListener(t *testing.T) {
	d := certstest.New(t)
	srv := serve(t, certstest.Source(t, d.Node("n1"), certs.NodeIdentity("n1")).ClientListenerConfig())
	for _, tc := range []struct {
		what string
		cfg  *tls.Config
		who  string
	}{
		{"a writer", certstest.Source(t, d.Client("trainer", certs.RoleWriter), certs.Identity{Kind: certs.KindClient}).DialConfig("localhost", ""), "client trainer (writer)"},
		{"no certificate (a token's caller)", certstest.Source(t, d.CAOnly(), certs.Identity{}).DialConfig("localhost", ""), "-"},
	} {
		if who, _, err := dial(srv, tc.cfg); err != nil || who != tc.who {
			t.Errorf("%s: %q, %v; want %q", tc.what, who, err, tc.who)
		}
	}
	if who, _, err := dial(srv, certstest.Presenting(certstest.New(t).Client("trainer", certs.RoleAdmin))); err == nil {
		t.Errorf("another CA's client admitted as %q", who)
	}
	if who, _, err := dial(srv, certstest.Presenting(d.ClientValid("old", certs.RoleAdmin, certstest.Expired()))); err == nil {
		t.Errorf("an expired client certificate admitted as %q", who)
	}
	old := &tls.Config{MaxVersion: tls.VersionTLS12, InsecureSkipVerify: true}
	if _, _, err := dial(srv, old); err == nil {
		t.Error("a TLS 1.2 client admitted")
	}
}

// TestDialVerifiesServer: a dialer accepts only a node of its CA whose
// certificate names the host dialed, and given a node ID only that node.
func TestDialVerifiesServer(t *testing.T) {
	d := certstest.New(t)
	n2 := certstest.Source(t, d.Node("n2"), certs.NodeIdentity("n2"))
	srv := serve(t, certstest.Source(t, d.Node("n1"), certs.NodeIdentity("n1")).PeerListenerConfig())
	if _, _, err := dial(srv, n2.DialConfig("n1.example", "")); err == nil || !strings.Contains(err.Error(), "n1.example") {
		t.Errorf("a host the certificate does not name: %v", err)
	}
	if _, _, err := dial(srv, n2.DialConfig("127.0.0.1", "n1")); err != nil {
		t.Errorf("n1 dialed as n1: %v", err)
	}
	if _, _, err := dial(srv, n2.DialConfig("127.0.0.1", "n3")); !errors.Is(err, certs.ErrRefused) || !strings.Contains(err.Error(), "is node n1, not node n3") {
		t.Errorf("n1 dialed as n3: %v, want a refusal naming both", err)
	}
	other := certstest.New(t)
	osrv := serve(t, certstest.Source(t, other.Node("n1"), certs.NodeIdentity("n1")).PeerListenerConfig())
	if _, _, err := dial(osrv, n2.DialConfig("127.0.0.1", "")); err == nil || !strings.Contains(err.Error(), "unknown authority") {
		t.Errorf("a server of another CA: %v", err)
	}
	// A client certificate cannot serve: it lacks server authentication.
	c := d.Client("trainer", certs.RoleAdmin)
	kp, err := tls.LoadX509KeyPair(c.Cert, c.Key)
	if err != nil {
		t.Fatal(err)
	}
	csrv := serve(t, &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{kp}})
	if _, _, err := dial(csrv, n2.DialConfig("127.0.0.1", "")); err == nil {
		t.Error("a server with a client certificate accepted")
	}
}

// TestSourceRotation: renewed files apply to the next handshakes without a
// new Source: a node's new certificate, and a CA added to the CA file (a
// CA rotation) whose clients are then admitted. A half-installed renewal
// (a certificate whose key has not arrived) keeps the old pair in use.
func TestSourceRotation(t *testing.T) {
	d := certstest.New(t)
	f := d.Node("n1")
	var mu sync.Mutex
	var reloads []error
	src, err := certs.NewSource(f, certs.SourceOptions{Want: certs.NodeIdentity("n1"), CheckEvery: 10 * time.Millisecond,
		OnReload: func(err error) { mu.Lock(); reloads = append(reloads, err); mu.Unlock() }})
	if err != nil {
		t.Fatal(err)
	}
	srv := serve(t, src.ClientListenerConfig())
	serial := func() string {
		c, err := tls.Dial("tcp", srv.addr, &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		return c.ConnectionState().PeerCertificates[0].SerialNumber.String()
	}
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !ok(); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("not within 10s: %s", what)
			}
		}
	}
	first := serial()

	// Half a renewal: only the certificate file is new.
	renewed := certstest.New(t)
	rf := renewed.Node("n1")
	b, _ := os.ReadFile(rf.Cert)
	if err := os.WriteFile(f.Cert, b, 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor("the half renewal noticed", func() bool { serial(); mu.Lock(); defer mu.Unlock(); return len(reloads) > 0 })
	for range 3 {
		if s := serial(); s != first {
			t.Fatalf("serving %s after half a renewal, want the old %s", s, first)
		}
	}

	// The whole renewal, by the same CA.
	d.NodeValid("n1", certs.Validity{})
	waitFor("the renewed certificate served", func() bool { return serial() != first })
	mu.Lock()
	if len(reloads) != 2 || reloads[0] == nil || reloads[1] != nil {
		t.Errorf("OnReload calls %v, want one error (reported once) then success", reloads)
	}
	mu.Unlock()

	// A CA rotation: a client of a new CA is refused until the new CA is
	// in the node's CA file, then admitted.
	// The client trusts both CAs, as every party does during a rotation.
	cf := renewed.Client("ops", certs.RoleAdmin)
	both := append(d.CA.CertPEM(), renewed.CA.CertPEM()...)
	cf.CA = filepath.Join(t.TempDir(), "both.crt")
	if err := os.WriteFile(cf.CA, both, 0o644); err != nil {
		t.Fatal(err)
	}
	cli := certstest.Source(t, cf, certs.Identity{})
	if who, _, err := dial(srv, cli.DialConfig("127.0.0.1", "")); err == nil {
		t.Fatalf("a client of a CA the node does not trust yet admitted as %q", who)
	}
	if err := os.WriteFile(f.CA, both, 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor("the new CA trusted", func() bool {
		who, _, err := dial(srv, cli.DialConfig("127.0.0.1", ""))
		return err == nil && who == "client ops (admin)"
	})
}

// TestNewSourceRefuses: a Source starts only on material that checks.
func TestNewSourceRefuses(t *testing.T) {
	d := certstest.New(t)
	other := certstest.New(t)
	n1, n2, of := d.Node("n1"), d.Node("n2"), other.Node("n1")
	exp := d.NodeValid("n3", certstest.Expired())
	for _, tc := range []struct {
		what  string
		files certs.Files
		want  certs.Identity
		msg   string
	}{
		{"another node's files", n2, certs.NodeIdentity("n1"), "is node n2, want node n1"},
		{"a client's files for a node", d.Client("c", certs.RoleReader), certs.Identity{Kind: certs.KindNode}, "is client c (reader), want a node"},
		{"no certificate for a node", d.CAOnly(), certs.Identity{Kind: certs.KindNode}, "is no certificate, want a node"},
		{"another CA's certificate", certs.Files{CA: n1.CA, Cert: of.Cert, Key: of.Key}, certs.NodeIdentity("n1"), "is not valid under"},
		{"an expired certificate", exp, certs.Identity{}, "expired"},
		{"a key of another certificate", certs.Files{CA: n1.CA, Cert: n1.Cert, Key: n2.Key}, certs.Identity{}, "private key does not match"},
		{"a certificate as the CA file", certs.Files{CA: n1.Cert, Cert: n1.Cert, Key: n1.Key}, certs.Identity{}, "is not a CA certificate"},
		{"a missing CA file", certs.Files{CA: d.Path + "/nope.crt"}, certs.Identity{}, "no such file"},
	} {
		_, err := certs.NewSource(tc.files, certs.SourceOptions{Want: tc.want})
		if !errors.Is(err, certs.ErrMaterial) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: %v, want ErrMaterial saying %q", tc.what, err, tc.msg)
		}
	}
}
