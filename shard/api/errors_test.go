package api

import (
	"errors"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestFromStatusWithoutReason: gRPC's own refusal of a message over a
// listener's receive limit carries no reason; the client still sees
// ErrRequestTooLarge, and the message (which names the limit) as it came.
func TestFromStatusWithoutReason(t *testing.T) {
	msg := "grpc: received message larger than max (41943050 vs. 17825792)"
	err := FromStatus(status.Error(codes.ResourceExhausted, msg))
	var re *RemoteError
	if !errors.Is(err, ErrRequestTooLarge) || !errors.As(err, &re) || re.Msg != msg || re.Code != codes.ResourceExhausted {
		t.Fatalf("FromStatus of a bare ResourceExhausted: %v, want ErrRequestTooLarge with the message", err)
	}
	if err := FromStatus(NewStatus(codes.ResourceExhausted, ReasonTableFull, "full", nil).Err()); !errors.Is(err, ErrTableFull) || errors.Is(err, ErrRequestTooLarge) {
		t.Fatalf("a reason still decides: %v", err)
	}
}
