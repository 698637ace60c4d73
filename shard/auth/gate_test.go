package auth_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/raftps/raftps/shard/api"
	"github.com/raftps/raftps/shard/auth"
	"github.com/raftps/raftps/shard/certs"
	"github.com/raftps/raftps/shard/certs/certstest"
	"github.com/raftps/raftps/shard/shardpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/reflection"
	rpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"
)

// clientAPI serves the client API's Pull, answering with the caller in a
// header; every other method is unimplemented, so a call that gets
// Unimplemented passed the gate and one that gets PermissionDenied did not.
type clientAPI struct {
	shardpb.UnimplementedParameterServerServer
}

func (clientAPI) Pull(ctx context.Context, _ *shardpb.PullRequest) (*shardpb.PullResponse, error) {
	p, _ := auth.FromContext(ctx)
	grpc.SetHeader(ctx, metadata.Pairs("who", p.String()))
	return &shardpb.PullResponse{}, nil
}

// peerAPI serves the peer API's Status (the caller's node ID) and
// ReportBroken, checked as the node will check it: the report is about the
// caller itself, and the caller is a member of the chain.
type peerAPI struct {
	shardpb.UnimplementedPeerServer
	chain map[string]bool
}

func (peerAPI) Status(ctx context.Context, _ *shardpb.StatusRequest) (*shardpb.StatusResponse, error) {
	id, _ := auth.NodeID(ctx)
	return &shardpb.StatusResponse{NodeId: id}, nil
}

func (p peerAPI) ReportBroken(ctx context.Context, req *shardpb.ReportBrokenRequest) (*shardpb.ReportBrokenResponse, error) {
	if err := auth.RequireNode(ctx, req.NodeId); err != nil {
		return nil, err
	}
	if _, err := auth.RequireMember(ctx, "chain "+req.Group, func(id string) bool { return p.chain[id] }); err != nil {
		return nil, err
	}
	return &shardpb.ReportBrokenResponse{}, nil
}

// serveGRPC serves srv's registrations on a loopback port until the test
// ends and returns the address.
func serveGRPC(t *testing.T, opts []grpc.ServerOption, register func(*grpc.Server)) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(opts...)
	register(srv)
	done := make(chan struct{})
	go func() { defer close(done); srv.Serve(lis) }()
	t.Cleanup(func() { srv.Stop(); <-done })
	return lis.Addr().String()
}

// conn dials addr with opts until the test ends.
func conn(t *testing.T, addr string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// call invokes method with an empty request and returns the status code
// and message.
func call(cc *grpc.ClientConn, method string, opts ...grpc.CallOption) (codes.Code, string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := cc.Invoke(ctx, method, &emptypb.Empty{}, &emptypb.Empty{}, opts...)
	st := status.Convert(err)
	return st.Code(), st.Message()
}

type clientCluster struct {
	dir   *certstest.Dir
	addr  string
	token string // a reader's

	mu      sync.Mutex
	refused []string // what the gate's OnRefused was told
}

func (c *clientCluster) refusals() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.refused...)
}

// startClientListener serves the client API behind a client gate on node
// n1's certificate, with one reader token.
func startClientListener(t *testing.T) *clientCluster {
	t.Helper()
	d := certstest.New(t)
	tok, rec, err := auth.NewToken("dashboard", certs.RoleReader)
	if err != nil {
		t.Fatal(err)
	}
	c := &clientCluster{dir: d, token: tok}
	g, err := auth.NewClientGate(auth.Config{Source: certstest.Source(t, d.Node("n1"), certs.NodeIdentity("n1")), Tokens: auth.TokenSet{rec.ID: rec},
		OnRefused: func(m string, err error) {
			c.mu.Lock()
			c.refused = append(c.refused, m+": "+err.Error())
			c.mu.Unlock()
		}})
	if err != nil {
		t.Fatal(err)
	}
	c.addr = serveGRPC(t, g.ServerOptions(), func(s *grpc.Server) {
		shardpb.RegisterParameterServerServer(s, clientAPI{})
		reflection.Register(s)
		// A service registered by mistake: no role may call it.
		healthpb.RegisterHealthServer(s, health.NewServer())
	})
	return c
}

func (c *clientCluster) dial(t *testing.T, f certs.Files, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	return conn(t, c.addr, append([]grpc.DialOption{grpc.WithTransportCredentials(auth.ClientCredentials(certstest.Source(t, f, certs.Identity{})))}, opts...)...)
}

// passed: the call reached its handler (Pull answers, the others are
// unimplemented).
func passed(code codes.Code) bool { return code == codes.OK || code == codes.Unimplemented }

// TestClientRoles: each role may call the methods of its level and below
// and is refused the others with PermissionDenied naming the role needed.
func TestClientRoles(t *testing.T) {
	c := startClientListener(t)
	methods := map[string]certs.Role{
		shardpb.ParameterServer_Pull_FullMethodName:         certs.RoleReader,
		shardpb.ParameterServer_Status_FullMethodName:       certs.RoleReader,
		shardpb.ParameterServer_Push_FullMethodName:         certs.RoleWriter,
		shardpb.ParameterServer_JoinJob_FullMethodName:      certs.RoleWriter,
		shardpb.ParameterServer_CreateTable_FullMethodName:  certs.RoleAdmin,
		shardpb.ParameterServer_AlterTable_FullMethodName:   certs.RoleAdmin,
		shardpb.ParameterServer_SetNodeAdmin_FullMethodName: certs.RoleAdmin,
		shardpb.ParameterServer_DeleteJob_FullMethodName:    certs.RoleAdmin,
		shardpb.ParameterServer_DropTable_FullMethodName:    certs.RoleAdmin,
	}
	for _, role := range []certs.Role{certs.RoleReader, certs.RoleWriter, certs.RoleAdmin} {
		cc := c.dial(t, c.dir.Client("u-"+role.String(), role))
		for m, need := range methods {
			code, msg := call(cc, m)
			if allowed := role >= need; allowed != passed(code) {
				t.Errorf("%v calling %s: %v %q; allowed: %v", role, m, code, msg, allowed)
			} else if !allowed && (code != codes.PermissionDenied || !strings.Contains(msg, "it needs role "+need.String())) {
				t.Errorf("%v calling %s: %v %q, want PermissionDenied naming role %v", role, m, code, msg, need)
			}
		}
	}
	// The handler sees the caller.
	var md metadata.MD
	cc := c.dial(t, c.dir.Client("trainer", certs.RoleWriter))
	if code, msg := call(cc, shardpb.ParameterServer_Pull_FullMethodName, grpc.Header(&md)); code != codes.OK || len(md["who"]) != 1 || md["who"][0] != "client trainer (writer)" {
		t.Errorf("Pull: %v %q, the handler saw %v", code, msg, md["who"])
	}
	// A method the table does not list is refused to everyone, admins
	// included.
	if code, msg := call(c.dial(t, c.dir.Client("root", certs.RoleAdmin)), healthpb.Health_Check_FullMethodName); code != codes.PermissionDenied {
		t.Errorf("an unlisted method: %v %q, want PermissionDenied", code, msg)
	}
}

// TestClientAuthentication: who gets in without a client certificate, and
// who does not.
func TestClientAuthentication(t *testing.T) {
	c := startClientListener(t)
	caOnly := c.dir.CAOnly()
	pull, push := shardpb.ParameterServer_Pull_FullMethodName, shardpb.ParameterServer_Push_FullMethodName

	bearer := func(tok string) grpc.DialOption { return grpc.WithPerRPCCredentials(auth.BearerToken(tok)) }
	if code, msg := call(c.dial(t, caOnly, bearer(c.token)), pull); code != codes.OK {
		t.Errorf("a reader's token pulling: %v %q", code, msg)
	}
	if code, msg := call(c.dial(t, caOnly, bearer(c.token)), push); code != codes.PermissionDenied || !strings.Contains(msg, "dashboard (reader) may not call ParameterServer/Push") {
		t.Errorf("a reader's token pushing: %v %q", code, msg)
	}
	wrong := c.token[:len(c.token)-1] + "A"
	if wrong == c.token {
		wrong = c.token[:len(c.token)-1] + "B"
	}
	forged, _, _ := auth.NewToken("dashboard", certs.RoleAdmin)
	refusals := []struct {
		what string
		f    certs.Files
		opts []grpc.DialOption
		code codes.Code
		msg  string
	}{
		{"nothing", caOnly, nil, codes.Unauthenticated, "no client certificate or bearer token"},
		{"a token with a wrong secret", caOnly, []grpc.DialOption{bearer(wrong)}, codes.Unauthenticated, "is not valid"},
		{"a token the cluster does not know", caOnly, []grpc.DialOption{bearer(forged)}, codes.Unauthenticated, "is not valid"},
		{"not a token", caOnly, []grpc.DialOption{bearer("hunter2")}, codes.Unauthenticated, "not a raftps token"},
		{"a certificate and a token", c.dir.Client("ops", certs.RoleAdmin), []grpc.DialOption{bearer(c.token)}, codes.Unauthenticated, "present one"},
		{"a node's certificate", c.dir.Node("n2"), nil, codes.PermissionDenied, "node n2 is not a client credential"},
	}
	for _, tc := range refusals {
		code, msg := call(c.dial(t, tc.f, tc.opts...), pull)
		if code != tc.code || !strings.Contains(msg, tc.msg) {
			t.Errorf("%s: %v %q, want %v saying %q", tc.what, code, msg, tc.code, tc.msg)
		}
		if code == codes.Unauthenticated && tc.what != "nothing" && strings.Contains(msg, c.token[22:]) {
			t.Errorf("%s: the refusal repeats a token's secret: %q", tc.what, msg)
		}
	}

	if got := c.refusals(); len(got) != len(refusals)+1 {
		t.Errorf("OnRefused was told %q, want the %d refusals above", got, len(refusals)+1)
	}

	// The handshake refuses these before any call.
	other := certstest.New(t)
	for _, tc := range []struct {
		what string
		opts []grpc.DialOption
	}{
		{"plaintext", []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}},
		{"an expired certificate", []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(certstest.Presenting(c.dir.ClientValid("old", certs.RoleAdmin, certstest.Expired()))))}},
		{"another CA's certificate", []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(certstest.Presenting(other.Client("ops", certs.RoleAdmin))))}},
	} {
		if code, msg := call(conn(t, c.addr, tc.opts...), pull); code != codes.Unavailable {
			t.Errorf("%s: %v %q, want Unavailable (no connection)", tc.what, code, msg)
		}
	}
	// A token is not sent in the clear: the client refuses.
	if _, err := grpc.NewClient(c.addr, grpc.WithTransportCredentials(insecure.NewCredentials()), bearer(c.token)); err == nil || !strings.Contains(err.Error(), "transport level security") {
		t.Errorf("a token over plaintext: %v", err)
	}
}

// TestReflection: reflection answers authenticated callers only.
func TestReflection(t *testing.T) {
	c := startClientListener(t)
	list := func(cc *grpc.ClientConn) (*rpb.ServerReflectionResponse, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		s, err := rpb.NewServerReflectionClient(cc).ServerReflectionInfo(ctx)
		if err != nil {
			return nil, err
		}
		// A refused stream's Send may fail with io.EOF; Recv has its status.
		_ = s.Send(&rpb.ServerReflectionRequest{MessageRequest: &rpb.ServerReflectionRequest_ListServices{}})
		return s.Recv()
	}
	if r, err := list(c.dial(t, c.dir.Client("viewer", certs.RoleReader))); err != nil || len(r.GetListServicesResponse().GetService()) == 0 {
		t.Errorf("a reader listing services: %v, %v", r, err)
	}
	if _, err := list(c.dial(t, c.dir.CAOnly())); status.Code(err) != codes.Unauthenticated {
		t.Errorf("an anonymous caller listing services: %v, want Unauthenticated", err)
	}
}

// TestPeerGate: only nodes reach the peer API; a node may speak for itself
// and the groups it is in only, and a dialing node finds the node it means
// at the address or does not connect.
func TestPeerGate(t *testing.T) {
	d := certstest.New(t)
	g, err := auth.NewPeerGate(auth.Config{Source: certstest.Source(t, d.Node("n1"), certs.NodeIdentity("n1"))})
	if err != nil {
		t.Fatal(err)
	}
	addr := serveGRPC(t, g.ServerOptions(), func(s *grpc.Server) {
		shardpb.RegisterPeerServer(s, peerAPI{chain: map[string]bool{"n1": true, "n2": true}})
	})
	nodeAt := func(id string) func(string) string {
		return func(a string) string {
			if a == addr {
				return id
			}
			return ""
		}
	}
	dialAs := func(self certs.Files, expect string) shardpb.PeerClient {
		return shardpb.NewPeerClient(conn(t, addr, grpc.WithTransportCredentials(auth.NodeCredentials(certstest.Source(t, self, certs.Identity{}), nodeAt(expect)))))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	n2, n3 := dialAs(d.Node("n2"), "n1"), dialAs(d.Node("n3"), "")
	if r, err := n2.Status(ctx, &shardpb.StatusRequest{}); err != nil || r.NodeId != "n2" {
		t.Errorf("n2's Status: the handler saw %q, %v", r.GetNodeId(), err)
	}
	if _, err := n2.ReportBroken(ctx, &shardpb.ReportBrokenRequest{NodeId: "n2", Group: "t/0"}); err != nil {
		t.Errorf("n2 reporting its own replica of a chain it is in: %v", err)
	}
	for _, tc := range []struct {
		what string
		c    shardpb.PeerClient
		req  *shardpb.ReportBrokenRequest
		msg  string
	}{
		{"n3 claiming to be n2", n3, &shardpb.ReportBrokenRequest{NodeId: "n2", Group: "t/0"}, "node n3 may not speak for node n2"},
		{"n3 about a chain it is not in", n3, &shardpb.ReportBrokenRequest{NodeId: "n3", Group: "t/0"}, "node n3 is not a member of chain t/0"},
	} {
		_, err := tc.c.ReportBroken(ctx, tc.req)
		if status.Code(err) != codes.PermissionDenied || !strings.Contains(status.Convert(err).Message(), tc.msg) {
			t.Errorf("%s: %v, want PermissionDenied saying %q", tc.what, err, tc.msg)
		}
		var re *api.RemoteError
		if !errors.As(api.FromStatus(err), &re) || re.Reason != auth.ReasonPermissionDenied {
			t.Errorf("%s: reason %v, want %s", tc.what, re, auth.ReasonPermissionDenied)
		}
	}

	for _, tc := range []struct {
		what string
		c    shardpb.PeerClient
	}{
		{"a client certificate", shardpb.NewPeerClient(conn(t, addr, grpc.WithTransportCredentials(auth.ClientCredentials(certstest.Source(t, d.Client("ops", certs.RoleAdmin), certs.Identity{})))))},
		{"no certificate", shardpb.NewPeerClient(conn(t, addr, grpc.WithTransportCredentials(auth.ClientCredentials(certstest.Source(t, d.CAOnly(), certs.Identity{})))))},
		{"n2 dialing the address of n3", dialAs(d.Node("n2"), "n3")},
		{"plaintext", shardpb.NewPeerClient(conn(t, addr, grpc.WithTransportCredentials(insecure.NewCredentials())))},
	} {
		if _, err := tc.c.Status(ctx, &shardpb.StatusRequest{}); status.Code(err) != codes.Unavailable {
			t.Errorf("%s: %v, want Unavailable (no connection)", tc.what, err)
		}
	}
}

// TestRotationOverGRPC: renewed files apply to new connections without a
// restart: the server's new certificate, and a client's certificate
// renewed with a higher role.
func TestRotationOverGRPC(t *testing.T) {
	d := certstest.New(t)
	g, err := auth.NewClientGate(auth.Config{Source: certstest.Source(t, d.Node("n1"), certs.NodeIdentity("n1"))})
	if err != nil {
		t.Fatal(err)
	}
	addr := serveGRPC(t, g.ServerOptions(), func(s *grpc.Server) { shardpb.RegisterParameterServerServer(s, clientAPI{}) })
	cf := d.Client("ops", certs.RoleReader)
	src := certstest.Source(t, cf, certs.Identity{})
	pull := func() (serial string, code codes.Code) {
		var p peer.Peer
		cc := conn(t, addr, grpc.WithTransportCredentials(auth.ClientCredentials(src)))
		defer cc.Close()
		if code, msg := call(cc, shardpb.ParameterServer_Pull_FullMethodName, grpc.Peer(&p)); code != codes.OK {
			t.Fatalf("Pull: %v %q", code, msg)
		}
		code, _ = call(cc, shardpb.ParameterServer_CreateTable_FullMethodName)
		return p.AuthInfo.(credentials.TLSInfo).State.PeerCertificates[0].SerialNumber.String(), code
	}
	first, code := pull()
	if code != codes.PermissionDenied {
		t.Fatalf("a reader creating a table: %v", code)
	}
	d.NodeValid("n1", certs.Validity{})
	d.Client("ops", certs.RoleAdmin)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		serial, code := pull()
		if serial != first && passed(code) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after renewal: serving serial %s (first %s), CreateTable %v", serial, first, code)
		}
	}
}

// TestChecksWithoutGate: the per-message checks fail closed on a context
// no gate has seen, and pass on an insecure listener.
func TestChecksWithoutGate(t *testing.T) {
	ctx := context.Background()
	if err := auth.RequireNode(ctx, "n1"); status.Code(err) != codes.Unauthenticated || !errors.Is(err, auth.ErrUnauthenticated) {
		t.Errorf("RequireNode without a gate: %v", err)
	}
	if _, err := auth.RequireMember(ctx, "g", func(string) bool { return true }); status.Code(err) != codes.Unauthenticated {
		t.Errorf("RequireMember without a gate: %v", err)
	}
	client := auth.WithPrincipal(ctx, auth.Principal{Identity: certs.ClientIdentity("ops", certs.RoleAdmin)})
	if err := auth.RequireNode(client, "ops"); !errors.Is(err, auth.ErrPermissionDenied) {
		t.Errorf("RequireNode of a client: %v", err)
	}
	g, err := auth.NewPeerGate(auth.Config{Insecure: true})
	if err != nil {
		t.Fatal(err)
	}
	ictx, err := g.Check(ctx, "/raftps.v1.Peer/Status")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := auth.NodeID(ictx); ok {
		t.Error("NodeID on an insecure listener: a node")
	}
	if err := auth.RequireNode(ictx, "n2"); err != nil {
		t.Errorf("RequireNode on an insecure listener: %v", err)
	}
	if _, err := auth.NewClientGate(auth.Config{}); err == nil {
		t.Error("a client gate with neither a source nor Insecure")
	}
	if _, err := auth.NewPeerGate(auth.Config{Insecure: true, Tokens: auth.TokenSet{}}); err == nil {
		t.Error("a peer gate that takes tokens")
	}
}

// TestPeerGateChecksAgain: the peer gate refuses a client's verified
// certificate and a call without TLS itself, should the listener's TLS
// configuration ever let one through.
func TestPeerGateChecksAgain(t *testing.T) {
	d := certstest.New(t)
	g, err := auth.NewPeerGate(auth.Config{Source: certstest.Source(t, d.Node("n1"), certs.NodeIdentity("n1"))})
	if err != nil {
		t.Fatal(err)
	}
	kp, err := tls.LoadX509KeyPair(d.Client("ops", certs.RoleAdmin).Cert, d.Client("ops", certs.RoleAdmin).Key)
	if err != nil {
		t.Fatal(err)
	}
	withTLS := peer.NewContext(context.Background(), &peer.Peer{AuthInfo: credentials.TLSInfo{State: tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{kp.Leaf}}}}})
	if _, err := g.Check(withTLS, shardpb.Peer_Status_FullMethodName); status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "client ops (admin) may not call the peer API") {
		t.Errorf("a client's certificate: %v", err)
	}
	if _, err := g.Check(context.Background(), shardpb.Peer_Status_FullMethodName); status.Code(err) != codes.Unauthenticated {
		t.Errorf("no TLS: %v", err)
	}
}
