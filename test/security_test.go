package test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/raftps/raftps/shard/certs"
	"github.com/raftps/raftps/shard/certs/certstest"
	"github.com/raftps/raftps/shard/client"
	"github.com/raftps/raftps/shard/shardpb"
	"github.com/raftps/raftps/test/localcluster"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// The adversarial suite of issue 24: a secure 3-node cluster of the real
// binary, attacked the ways the issue lists (each a reproduction of what
// an unauthenticated cluster let anyone do) and with the credentials an
// attacker might hold: none, another CA's, an expired one, a client's on
// the peer listener, a node's claiming to be another node, a reader's and
// a writer's beyond their role. Every attack must be refused, and
// afterwards the cluster must be whole: every node still sees the others
// alive, the metadata group's terms are sane, nothing was reconfigured,
// and a chaos round with leader kills loses nothing, is linearizable and
// ends with equal replica checksums.

// attackBed is the cluster under attack and the material of its
// attackers.
type attackBed struct {
	t       *testing.T
	bin     string
	dir     string
	cluster string
	lc      *localcluster.Cluster
	admin   *client.Client
	// Certificates the cluster's CA signed: a node that is not in the
	// cluster (n9), clients with roles, an expired client. other is
	// another CA's directory.
	n9, reader, writer, expired certs.Files
	other                       *certstest.Dir
}

func newAttackBed(t *testing.T) *attackBed {
	t.Helper()
	bin, dir, cluster := binaryCluster(t, fastTimeouts)
	lc, err := localcluster.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	cfg := testClientConfig(t, cluster)
	cfg.RetryTimeout = 20 * time.Second
	admin, err := client.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close() })
	b := &attackBed{t: t, bin: bin, dir: dir, cluster: cluster, lc: lc, admin: admin, other: certstest.New(t)}
	cd := lc.CertsDir()
	if _, err := certs.CreateNode(cd, "n9", []string{"127.0.0.1", "localhost"}, certs.Options{}); err != nil {
		t.Fatal(err)
	}
	b.n9 = certs.NodeFiles(cd, "n9")
	for _, c := range []struct {
		name string
		role certs.Role
		v    certs.Validity
		out  *certs.Files
	}{{"viewer", certs.RoleReader, certs.Validity{}, &b.reader}, {"trainer", certs.RoleWriter, certs.Validity{}, &b.writer},
		{"old", certs.RoleAdmin, certstest.Expired(), &b.expired}} {
		if _, err := certs.CreateClient(cd, c.name, c.role, certs.Options{Validity: c.v}); err != nil {
			t.Fatal(err)
		}
		*c.out = certs.ClientFiles(cd, c.name)
	}
	return b
}

// node returns node id's files (made by cluster up) and addresses.
func (b *attackBed) node(id string) (certs.Files, localcluster.Node) {
	b.t.Helper()
	nd, err := b.lc.Node(id)
	if err != nil {
		b.t.Fatal(err)
	}
	return certs.NodeFiles(b.lc.CertsDir(), id), nd
}

// dial connects to addr presenting files' certificate (none if nil), as
// an attacker would: whatever the server asks for, checking nothing of
// the server.
func (b *attackBed) dial(addr string, files *certs.Files) *grpc.ClientConn {
	b.t.Helper()
	cfg := &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true}
	if files != nil {
		cfg = certstest.Presenting(*files)
	}
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		b.t.Fatal(err)
	}
	b.t.Cleanup(func() { cc.Close() })
	return cc
}

// plain connects to addr in plaintext.
func (b *attackBed) plain(addr string) *grpc.ClientConn {
	b.t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.t.Fatal(err)
	}
	b.t.Cleanup(func() { cc.Close() })
	return cc
}

func ctx10s(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// refused fails the test unless err is a status of code whose message
// says msg.
func refused(t *testing.T, what string, err error, code codes.Code, msg string) {
	t.Helper()
	st := status.Convert(err)
	if err == nil || st.Code() != code || !strings.Contains(st.Message(), msg) {
		t.Errorf("%s: %v, want %v saying %q", what, err, code, msg)
	}
}

// TestBinaryAdversarial runs every attack against one secure cluster, then
// checks it is whole.
func TestBinaryAdversarial(t *testing.T) {
	waitsMostly(t)
	b := newAttackBed(t)
	ctx := ctx10s(t)
	for _, spec := range []client.TableSpec{
		{Name: "sec", Dim: 2, Shards: 2, Optimizer: "sgd:lr=1", Initializer: "zeros"},
		{Name: "secchn", Dim: 2, Shards: 1, Optimizer: "sgd:lr=1", Initializer: "zeros", Replication: client.Chain},
	} {
		if _, err := b.admin.Tables().Create(ctx, spec); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.admin.Push(ctx, "sec", []uint64{1, 2}, []float32{-1, -1, -2, -2}); err != nil {
		t.Fatal(err)
	}
	before := b.snapshot(ctx)

	t.Run("credentials", b.credentials)
	t.Run("roles", b.roles)
	t.Run("tokens", b.tokens)
	t.Run("raft", b.raftForgeries)
	t.Run("chain", b.chainForgeries)
	t.Run("node calls", b.nodeCalls)
	t.Run("gossip", b.gossip)
	t.Run("http", b.httpPort)

	after := b.snapshot(ctx10s(t))
	if before.placement != after.placement {
		t.Errorf("the attacks changed the placement:\nbefore %s\nafter  %s", before.placement, after.placement)
	}
	if after.maxMetaTerm > before.maxMetaTerm+100 {
		t.Errorf("a metadata replica's term jumped from %d to %d", before.maxMetaTerm, after.maxMetaTerm)
	}
	if after.spec != before.spec {
		t.Errorf("table sec changed: %s, was %s", after.spec, before.spec)
	}

	s, code := runChaos(t, b.bin, b.dir, "--duration", "16s", "--every", "7s", "--down", "2s", "--faults", "kill-leader", "--tables", "chaos_lin,chaos_chn")
	t.Logf("chaos after the attacks: %d faults, %d acked, linearizable %v, checksums equal %v", len(s.Faults), s.Acked, deref(s.Linearizable), s.ChecksumsEqual)
	if code != 0 || len(s.Violations) > 0 || s.Acked == 0 || s.Lost != 0 || s.Doubled != 0 || s.Linearizable == nil || !*s.Linearizable || !s.ChecksumsEqual {
		t.Errorf("chaos after the attacks (exit %d): %+v", code, s)
	}
}

// clusterState is what the attacks must not change.
type clusterState struct {
	placement   string // every shard's replicas
	spec        string // table sec's spec
	maxMetaTerm uint64
}

func (b *attackBed) snapshot(ctx context.Context) clusterState {
	b.t.Helper()
	var s clusterState
	cm, err := b.admin.Admin().ClusterMap(ctx)
	if err != nil {
		b.t.Fatal(err)
	}
	s.placement = fmt.Sprint(cm.Shards)
	d, err := b.admin.Tables().Describe(ctx, "sec")
	if err != nil {
		b.t.Fatal(err)
	}
	s.spec = fmt.Sprintf("%+v", d.Spec)
	for _, nd := range b.lc.Nodes {
		st, err := b.admin.Admin().NodeStatus(ctx, nd.Addr, false)
		if err != nil {
			b.t.Fatalf("status of %s: %v", nd.ID, err)
		}
		for _, r := range st.Replicas {
			if r.Group == "meta" {
				s.maxMetaTerm = max(s.maxMetaTerm, r.Term)
			}
		}
		alive := 0
		for _, o := range st.Nodes {
			if o.State == "alive" {
				alive++
			}
		}
		if alive != len(b.lc.Nodes) {
			b.t.Errorf("%s sees %d of %d nodes alive: %+v", nd.ID, alive, len(b.lc.Nodes), st.Nodes)
		}
	}
	return s
}

// credentials: no certificate, another CA's, an expired one, plaintext, a
// client certificate on the peer listener, a node's on the client
// listener.
func (b *attackBed) credentials(t *testing.T) {
	n1, nd1 := b.node("n1")
	admin := certs.ClientFiles(b.lc.CertsDir(), localcluster.AdminClient)
	otherAdmin, otherN2 := b.other.Client("admin", certs.RoleAdmin), b.other.Node("n2")
	pull := func(cc *grpc.ClientConn) error {
		_, err := shardpb.NewParameterServerClient(cc).Status(ctx10s(t), &shardpb.StatusRequest{})
		return err
	}
	peerStatus := func(cc *grpc.ClientConn) error {
		_, err := shardpb.NewPeerClient(cc).Status(ctx10s(t), &shardpb.StatusRequest{})
		return err
	}
	if err := pull(b.dial(nd1.Addr, &admin)); err != nil {
		t.Fatalf("the admin's own certificate: %v (the checks below would prove nothing)", err)
	}
	refused(t, "no certificate", pull(b.dial(nd1.Addr, nil)), codes.Unauthenticated, "no client certificate or bearer token")
	refused(t, "a node's certificate on the client listener", pull(b.dial(nd1.Addr, &n1)), codes.PermissionDenied, "not a client credential")
	for _, tc := range []struct {
		what string
		cc   *grpc.ClientConn
		call func(*grpc.ClientConn) error
	}{
		{"plaintext to the client listener", b.plain(nd1.Addr), pull},
		{"another CA's certificate", b.dial(nd1.Addr, &otherAdmin), pull},
		{"an expired certificate", b.dial(nd1.Addr, &b.expired), pull},
		{"plaintext to the peer listener", b.plain(nd1.PeerAddr), peerStatus},
		{"no certificate on the peer listener", b.dial(nd1.PeerAddr, nil), peerStatus},
		{"a client certificate on the peer listener", b.dial(nd1.PeerAddr, &admin), peerStatus},
		{"another CA's node certificate on the peer listener", b.dial(nd1.PeerAddr, &otherN2), peerStatus},
	} {
		// The handshake refuses them: no connection, so Unavailable.
		if err := tc.call(tc.cc); status.Code(err) != codes.Unavailable {
			t.Errorf("%s: %v, want Unavailable (no connection)", tc.what, err)
		}
	}
}

// roles: a reader pushing, a writer creating a table, and the admin calls
// of the issue by callers below admin.
func (b *attackBed) roles(t *testing.T) {
	_, nd1 := b.node("n1")
	reader := shardpb.NewParameterServerClient(b.dial(nd1.Addr, &b.reader))
	writer := shardpb.NewParameterServerClient(b.dial(nd1.Addr, &b.writer))
	if _, err := reader.Status(ctx10s(t), &shardpb.StatusRequest{}); err != nil {
		t.Errorf("a reader asking for status: %v", err)
	}
	_, err := reader.Push(ctx10s(t), &shardpb.PushRequest{Table: "sec"})
	refused(t, "a reader pushing", err, codes.PermissionDenied, "client viewer (reader) may not call ParameterServer/Push: it needs role writer")
	_, err = writer.CreateTable(ctx10s(t), &shardpb.CreateTableRequest{})
	refused(t, "a writer creating a table", err, codes.PermissionDenied, "client trainer (writer) may not call ParameterServer/CreateTable")
	_, err = writer.AlterTable(ctx10s(t), &shardpb.AlterTableRequest{Name: "sec", Consistency: shardpb.Consistency_CONSISTENCY_EVENTUAL})
	refused(t, "a writer making a table eventual", err, codes.PermissionDenied, "needs role admin")
	for _, a := range []shardpb.NodeAdmin{shardpb.NodeAdmin_NODE_DRAINING, shardpb.NodeAdmin_NODE_REMOVED} {
		_, err = writer.SetNodeAdmin(ctx10s(t), &shardpb.SetNodeAdminRequest{Id: "n2", Admin: a})
		refused(t, "a writer setting n2 "+a.String(), err, codes.PermissionDenied, "needs role admin")
	}
	_, err = writer.DeleteJob(ctx10s(t), &shardpb.DeleteJobRequest{Job: "j"})
	refused(t, "a writer deleting a job", err, codes.PermissionDenied, "needs role admin")
	_, err = reader.JoinJob(ctx10s(t), &shardpb.JoinJobRequest{Job: "j", World: 2, Rank: -1, Addr: "127.0.0.1:1"})
	refused(t, "a reader joining a job", err, codes.PermissionDenied, "needs role writer")
}

// tokens: a token presented with a certificate, a token on the peer
// listener, a token below admin making tokens, a revoked token.
func (b *attackBed) tokens(t *testing.T) {
	tok, _, pending, err := b.admin.Admin().CreateToken(ctx10s(t), "attack-writer", "writer")
	if err != nil || len(pending) != 0 {
		t.Fatalf("creating a token: %v (pending %v)", err, pending)
	}
	_, nd1 := b.node("n1")
	withCert := b.dial(nd1.Addr, &b.reader)
	_, err = shardpb.NewParameterServerClient(withCert).Status(metadata.AppendToOutgoingContext(ctx10s(t), "authorization", "Bearer "+tok), &shardpb.StatusRequest{})
	refused(t, "a token with a certificate", err, codes.Unauthenticated, "both a client certificate and a bearer token")
	onPeer, err := grpc.NewClient(nd1.PeerAddr, tokenDial(t, tok)...)
	if err != nil {
		t.Fatal(err)
	}
	defer onPeer.Close()
	if _, err := shardpb.NewPeerClient(onPeer).Status(ctx10s(t), &shardpb.StatusRequest{}); status.Code(err) != codes.Unavailable {
		t.Errorf("a token on the peer listener: %v, want Unavailable (no connection without a node certificate)", err)
	}
	writer := tokenClient(t, b.cluster, tok)
	if _, _, _, err := writer.Admin().CreateToken(ctx10s(t), "attack-admin", "admin"); !errors.Is(err, client.ErrPermissionDenied) {
		t.Errorf("a writer token making an admin token: %v, want PermissionDenied", err)
	}
	if _, _, err := writer.Admin().RevokeToken(ctx10s(t), "attack-writer"); !errors.Is(err, client.ErrPermissionDenied) {
		t.Errorf("a writer token revoking a token: %v, want PermissionDenied", err)
	}
	if _, _, err := b.admin.Admin().RevokeToken(ctx10s(t), "attack-writer"); err != nil {
		t.Fatal(err)
	}
	for _, nd := range b.lc.Nodes {
		refused(t, nd.ID+": a revoked token", tokenStatus(t, nd.Addr, tok), codes.Unauthenticated, "not valid")
	}
}

// httpPort: no pprof without --pprof.
func (b *attackBed) httpPort(t *testing.T) {
	_, nd1 := b.node("n1")
	for _, path := range []string{"/debug/pprof/", "/debug/pprof/trace?seconds=86400", "/debug/netfault"} {
		resp, err := http.Get("http://" + nd1.HTTP + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("GET %s: %s, want 404 (no --pprof, no --fault-injection)", path, resp.Status)
		}
	}
	resp, err := http.Get("http://" + nd1.HTTP + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("GET /healthz: %s, want 200: health stays readable", resp.Status)
	}
}
