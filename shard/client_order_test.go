package shard

import (
	"context"
	"errors"
	"slices"
	"strings"
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

// TestClientGaveUpSaysWhy: when the retry time runs out inside an attempt,
// the error still carries the last real failure (a refused connection),
// not only "context deadline exceeded", and still is the deadline for
// errors.Is.
func TestClientGaveUpSaysWhy(t *testing.T) {
	c, err := NewClient(ClientConfig{Addrs: []string{"a:1"}, RetryTimeout: 200 * time.Millisecond, AttemptTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	calls := 0
	err = c.withRetry(context.Background(), "", "", func(ctx context.Context, addr string) error {
		calls++
		if calls == 1 {
			return status.Error(codes.Unavailable, "dial tcp a:1: connect: connection refused")
		}
		<-ctx.Done() // the node accepted and went silent
		return status.FromContextError(ctx.Err()).Err()
	})
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "connection refused") || calls != 2 {
		t.Fatalf("after %d calls: %v; want the deadline, naming the refused connection before it", calls, err)
	}
	t.Log(err)
}
