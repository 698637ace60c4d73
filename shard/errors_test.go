package shard

import (
	"errors"
	"fmt"
	"testing"
)

// TestErrorRoundTrip: every sentinel in codeOf, wrapped with context and sent
// as a status, comes back on the client as that same sentinel and no other
// of the table. In particular shard.ErrBadRequest and
// replication.ErrBadRequest (both InvalidArgument) stay apart, which needs
// their texts to differ.
func TestErrorRoundTrip(t *testing.T) {
	for _, e := range codeOf {
		got := fromStatus(toStatus(fmt.Errorf("table %q: %w: detail", "t", e.err)))
		if !errors.Is(got, e.err) {
			t.Errorf("%v: came back as %v", e.err, got)
		}
		var re *RemoteError
		if !errors.As(got, &re) || re.Code != e.code {
			t.Errorf("%v: came back with code %v, want %v", e.err, re, e.code)
		}
		for _, o := range codeOf {
			if o.err != e.err && errors.Is(got, o.err) {
				t.Errorf("%v: came back as %v as well", e.err, o.err)
			}
		}
	}
}
