package shard

import (
	"slices"
	"testing"
	"time"
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
