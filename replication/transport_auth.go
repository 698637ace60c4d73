package replication

import (
	"bytes"
	"context"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// authorize asks MuxConfig.Authorize whether the caller may send cmd to
// t's group. Raft takes a message's sender from its RPCHeader, and from
// the deprecated Leader or Candidate field when the header has no address:
// a message must name its sender in the header, and the old field, if set,
// must agree, so that what is checked is what Raft believes.
func (t *Transport) authorize(ctx context.Context, cmd any) error {
	check := t.mux.cfg.Authorize
	if check == nil {
		return nil
	}
	h, ok := cmd.(raft.WithRPCHeader)
	if !ok {
		return status.Errorf(codes.InvalidArgument, "raft group %q: a %T carries no sender", t.group, cmd)
	}
	hdr := h.GetRPCHeader()
	var old []byte
	switch m := cmd.(type) {
	case *raft.AppendEntriesRequest:
		//lint:ignore SA1019 the deprecated field Raft still reads
		old = m.Leader
	case *raft.RequestVoteRequest:
		//lint:ignore SA1019 the deprecated field Raft still reads
		old = m.Candidate
	case *raft.InstallSnapshotRequest:
		old = m.Leader
	}
	switch {
	case len(hdr.ID) == 0 || len(hdr.Addr) == 0:
		return status.Errorf(codes.InvalidArgument, "raft group %q: a message without its sender's ID and address in the header", t.group)
	case len(old) > 0 && !bytes.Equal(old, hdr.Addr):
		return status.Errorf(codes.InvalidArgument, "raft group %q: a message whose header names %q and whose leader or candidate field names %q", t.group, hdr.Addr, old)
	}
	return check(ctx, t.group, string(hdr.ID), string(hdr.Addr))
}
