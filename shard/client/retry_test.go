package client

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/raftps/raftps/shard/api"
	"google.golang.org/grpc/codes"
)

// TestRedirectBeatsAHedgeMark: a node that a hedge beat on a read lately
// is asked after the others, but a NotLeader answer that names it as the
// leader sends the write there at once. Before, the first candidate's
// redirect ended each round before the marked leader's turn, and a push
// waited until the mark expired (2 s).
func TestRedirectBeatsAHedgeMark(t *testing.T) {
	cfg := DefaultConfig("a:1", "b:1", "c:1")
	cfg.SuspectAfter = -1
	cfg.RetryTimeout = time.Second
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.hedge.slow.mark("b:1")
	var asked []string
	start := time.Now()
	err = c.retry(context.Background(), "t/0", "", func() []string { return []string{"a:1"} }, nil,
		func(_ context.Context, addr string) error {
			asked = append(asked, addr)
			if addr == "b:1" {
				return nil
			}
			return api.NewStatus(codes.FailedPrecondition, api.ReasonNotLeader, "not the leader",
				&api.NotLeaderError{Group: "t/0", LeaderID: "n2", LeaderAddr: "b:1"}).Err()
		})
	if err != nil {
		t.Fatalf("retry: %v (asked %v)", err, asked)
	}
	if took := time.Since(start); len(asked) != 2 || !slices.Equal(asked, []string{"a:1", "b:1"}) {
		t.Fatalf("asked %v in %s, want a:1 then the leader it names, b:1", asked, took)
	}
}
