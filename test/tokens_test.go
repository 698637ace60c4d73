package test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/raftps/raftps/shard/auth"
	"github.com/raftps/raftps/shard/certs"
	"github.com/raftps/raftps/shard/client"
	"github.com/raftps/raftps/shard/shardpb"
	"github.com/raftps/raftps/test/localcluster"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
)

// Bearer tokens of issue 24 against a secure 3-node cluster of the binary:
// made with the CLI by the admin, stored (hashed) in the metadata group,
// checked by every node against its own replica, kept across restarts of
// every node, and refused on every node once revoked.

// tokenDial are the dial options of a caller holding the cluster's CA and
// a bearer token, no certificate.
func tokenDial(t *testing.T, tok string) []grpc.DialOption {
	t.Helper()
	src, err := certs.NewSource(certs.Files{CA: certs.ClientFiles(testCA(t), localcluster.AdminClient).CA}, certs.SourceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return []grpc.DialOption{grpc.WithTransportCredentials(auth.ClientCredentials(src)), grpc.WithPerRPCCredentials(auth.BearerToken(tok))}
}

// tokenClient is a client of the cluster holding tok.
func tokenClient(t *testing.T, cluster, tok string) *client.Client {
	t.Helper()
	cfg := client.DefaultConfig(strings.Split(cluster, ",")...)
	cfg.DialOptions = tokenDial(t, tok)
	cfg.RetryTimeout = 5 * time.Second
	c, err := client.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// tokenStatus asks node addr for its status with tok, on a connection of
// its own: the answer is that node's judgement of the token.
func tokenStatus(t *testing.T, addr, tok string) error {
	t.Helper()
	cc, err := grpc.NewClient(addr, tokenDial(t, tok)...)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = shardpb.NewParameterServerClient(cc).Status(ctx, &shardpb.StatusRequest{})
	return err
}

type createdToken struct {
	Token   string       `json:"token"`
	Info    client.Token `json:"info"`
	Pending []string     `json:"pending"`
}

func TestBinaryTokens(t *testing.T) {
	waitsMostly(t)
	bin, dir, cluster := binaryCluster(t, fastTimeouts)
	lc, err := localcluster.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	admin, err := client.New(testClientConfig(t, cluster))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	ctx := ctx10s(t)
	if _, err := admin.Tables().Create(ctx, client.TableSpec{Name: "tok", Dim: 2, Shards: 2, Optimizer: "sgd:lr=1", Initializer: "zeros"}); err != nil {
		t.Fatal(err)
	}

	// The admin makes the tokens with the CLI (its certificate is in the
	// environment: see testCA).
	create := func(name, role string) createdToken {
		var c createdToken
		out := runRaftps(t, bin, "token", "create", "--name", name, "--role", role, "--json", "--cluster", cluster)
		if err := json.Unmarshal([]byte(out), &c); err != nil {
			t.Fatalf("token create: %v\n%s", err, out)
		}
		if !strings.HasPrefix(c.Token, "rpst_"+c.Info.ID+"_") || c.Info.Name != name || c.Info.Role != role || len(c.Pending) != 0 {
			t.Fatalf("token create %s %s: %+v", name, role, c)
		}
		return c
	}
	rd, wr := create("dashboards", "reader"), create("ci", "writer")

	reader, writer := tokenClient(t, cluster, rd.Token), tokenClient(t, cluster, wr.Token)
	if err := writer.Push(ctx, "tok", []uint64{1, 2}, []float32{-1, -1, -2, -2}); err != nil {
		t.Fatalf("the writer token pushing: %v", err)
	}
	out := make([]float32, 4)
	if err := reader.Pull(ctx, "tok", []uint64{1, 2}, out); err != nil || out[0] != 1 || out[3] != 2 {
		t.Fatalf("the reader token pulling: %v, rows %v", err, out)
	}
	if _, err := reader.Tables().Describe(ctx, "tok"); err != nil {
		t.Fatalf("the reader token describing: %v", err)
	}
	if err := reader.Push(ctx, "tok", []uint64{1}, []float32{1, 1}); !errors.Is(err, client.ErrPermissionDenied) || !strings.Contains(err.Error(), "needs role writer") {
		t.Errorf("the reader token pushing: %v, want PermissionDenied (needs role writer)", err)
	}
	if _, err := writer.Tables().Create(ctx, client.TableSpec{Name: "nope", Dim: 2, Shards: 1}); !errors.Is(err, client.ErrPermissionDenied) {
		t.Errorf("the writer token creating a table: %v, want PermissionDenied", err)
	}
	for _, c := range []*client.Client{reader, writer} {
		if _, err := c.Admin().Tokens(ctx); !errors.Is(err, client.ErrPermissionDenied) {
			t.Errorf("a token below admin listing tokens: %v, want PermissionDenied", err)
		}
		if _, _, _, err := c.Admin().CreateToken(ctx, "escalate", "admin"); !errors.Is(err, client.ErrPermissionDenied) {
			t.Errorf("a token below admin creating an admin token: %v, want PermissionDenied", err)
		}
	}

	// The list shows both, and nothing of their secrets.
	list := runRaftps(t, bin, "token", "list", "--json", "--cluster", cluster)
	var toks []client.Token
	if err := json.Unmarshal([]byte(list), &toks); err != nil {
		t.Fatal(err)
	}
	if len(toks) != 2 || toks[0] != rd.Info && toks[1] != rd.Info || toks[0] != wr.Info && toks[1] != wr.Info {
		t.Errorf("token list: %+v, want %+v and %+v", toks, rd.Info, wr.Info)
	}
	for _, c := range []createdToken{rd, wr} {
		secret := strings.TrimPrefix(c.Token, "rpst_"+c.Info.ID+"_")
		if strings.Contains(list, secret) {
			t.Errorf("token list shows the secret of %s", c.Info.Name)
		}
	}

	// A token with a wrong secret (the right ID), and a made-up one, are
	// refused by every node.
	wrong := wr.Token[:len(wr.Token)-1] + map[bool]string{true: "B", false: "A"}[strings.HasSuffix(wr.Token, "A")]
	for _, nd := range lc.Nodes {
		refused(t, nd.ID+": a wrong secret", tokenStatus(t, nd.Addr, wrong), codes.Unauthenticated, "bearer token "+wr.Info.ID+" is not valid")
		refused(t, nd.ID+": not a token", tokenStatus(t, nd.Addr, "rpst_nonsense"), codes.Unauthenticated, "not a raftps token")
	}

	// A node restarted: the tokens come back from its metadata replica's
	// disk state (and the log it catches up with: a restarted node accepts
	// a token once its replica has the record).
	restarted := lc.Nodes[0]
	runRaftps(t, bin, "cluster", "restart", restarted.ID, "--dir", dir)
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if err = tokenStatus(t, restarted.Addr, rd.Token); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatalf("%s after its restart: the reader token: %v", restarted.ID, err)
	}

	// A token change waits only for the nodes gossip sees alive (a node it
	// takes for dead is named pending at once), and the restarted node may
	// serve before the metadata leader's gossip sees it back.
	waitCLIStatus(t, bin, cluster, 30*time.Second, "every node alive by gossip", func(st *client.ClusterStatus) string {
		for _, nd := range st.Nodes {
			if nd.State != "alive" {
				return nd.ID + " is " + nd.State
			}
		}
		return ""
	})

	// Revoked, by name through one node and by ID through another: the
	// call answers once every node has applied the revocation, so the
	// next call with the token is refused on every node.
	revoke := func(via localcluster.Node, idOrName string) {
		var r struct {
			Revoked client.Token `json:"revoked"`
			Pending []string     `json:"pending"`
		}
		out := runRaftps(t, bin, "token", "revoke", idOrName, "--json", "--cluster", via.Addr)
		if err := json.Unmarshal([]byte(out), &r); err != nil || len(r.Pending) != 0 {
			t.Fatalf("token revoke %s via %s: %v %s", idOrName, via.ID, err, out)
		}
	}
	revoke(lc.Nodes[2], "dashboards")
	revoke(lc.Nodes[1], wr.Info.ID)
	for _, nd := range lc.Nodes {
		refused(t, nd.ID+": the revoked reader token", tokenStatus(t, nd.Addr, rd.Token), codes.Unauthenticated, "not valid")
		refused(t, nd.ID+": the revoked writer token", tokenStatus(t, nd.Addr, wr.Token), codes.Unauthenticated, "not valid")
	}
	if toks, err := admin.Admin().Tokens(ctx10s(t)); err != nil || len(toks) != 0 {
		t.Errorf("tokens after revoking both: %v, %v", toks, err)
	}
	if _, _, err := admin.Admin().RevokeToken(ctx10s(t), "dashboards"); !errors.Is(err, client.ErrUnknownToken) {
		t.Errorf("revoking a revoked token: %v, want ErrUnknownToken", err)
	}
}
