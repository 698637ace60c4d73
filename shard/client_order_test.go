package shard

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestClientOrderAsksSilentNodesLast: retries ask each address once per
// round, and a node that did not answer lately after the others, until
// silentFor has passed.
func TestClientOrderAsksSilentNodesLast(t *testing.T) {
	c, err := NewClient(ClientConfig{Addrs: []string{"a:1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got := c.order([]string{"b", "a", "b", "c", "a"}); !slices.Equal(got, []string{"b", "a", "c"}) {
		t.Errorf("order %v, want b a c", got)
	}
	c.markSilent("b")
	if got := c.order([]string{"b", "a", "c"}); !slices.Equal(got, []string{"a", "c", "b"}) {
		t.Errorf("with b silent: %v, want a c b", got)
	}
	if !c.isSilent("b") || c.isSilent("a") {
		t.Error("isSilent disagrees with markSilent")
	}
	c.mu.Lock()
	c.silent["b"] = time.Now().Add(-silentFor - time.Millisecond)
	c.mu.Unlock()
	if got := c.order([]string{"b", "a"}); !slices.Equal(got, []string{"b", "a"}) {
		t.Errorf("after silentFor: %v, want b a", got)
	}
}

// TestClientRetriesCallsTheServerCancelled: a call the server or the
// transport cancelled (RST_STREAM CANCEL, as a closing server sends) has an
// unknown outcome, like a timeout, and is retried; a call the caller
// cancelled is not. The retry loop sees the attempt's error through
// fromStatus, as here.
func TestClientRetriesCallsTheServerCancelled(t *testing.T) {
	c, err := NewClient(ClientConfig{Addrs: []string{"a:1"}, SuspectAfter: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	reset := status.Error(codes.Canceled, "stream terminated by RST_STREAM with error code: CANCEL")
	got := fromStatus(c.attempt(context.Background(), "a:1", func(context.Context, string) error { return reset }))
	if !retryable(got) {
		t.Errorf("a call the server cancelled: %v, not retryable", got)
	}
	ctx, cancel := context.WithCancel(context.Background())
	got = fromStatus(c.attempt(ctx, "a:1", func(context.Context, string) error {
		cancel()
		return status.Error(codes.Canceled, "context canceled")
	}))
	if retryable(got) || !errors.Is(got, context.Canceled) {
		t.Errorf("a call its caller cancelled: %v, want context.Canceled, not retryable", got)
	}
}
