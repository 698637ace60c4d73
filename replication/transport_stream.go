package replication

import (
	"context"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/hashicorp/raft"
	"github.com/raftps/raftps/replication/transportpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// InstallSnapshot streams the snapshot in 1 MiB chunks after the request.
func (t *Transport) InstallSnapshot(_ raft.ServerID, target raft.ServerAddress, args *raft.InstallSnapshotRequest, resp *raft.InstallSnapshotResponse, data io.Reader) error {
	if err := t.isClosed(); err != nil {
		return err
	}
	c, err := t.mux.client(target)
	if err != nil {
		return err
	}
	req, err := encode(args)
	if err != nil {
		return err
	}
	// As NetworkTransport: the timeout grows with the snapshot.
	timeout := t.mux.cfg.Timeout * time.Duration(1+args.Size/(256<<20))
	ctx, cancel := context.WithTimeout(t.ctx, timeout)
	defer cancel()
	stream, err := c.InstallSnapshot(ctx)
	if err != nil {
		return fmt.Errorf("raft group %q: snapshot to %s: %w", t.group, target, err)
	}
	if err := stream.Send(&transportpb.SnapshotChunk{Group: t.group, Request: req}); err != nil {
		return fmt.Errorf("raft group %q: snapshot to %s: %w", t.group, target, err)
	}
	buf := make([]byte, snapshotChunkBytes)
	for {
		n, rerr := io.ReadFull(data, buf)
		if n > 0 {
			if err := stream.Send(&transportpb.SnapshotChunk{Data: buf[:n]}); err != nil {
				break // the server's answer (CloseAndRecv) says why
			}
		}
		if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
			break
		}
		if rerr != nil {
			return fmt.Errorf("raft group %q: reading snapshot for %s: %w", t.group, target, rerr)
		}
	}
	out, err := stream.CloseAndRecv()
	if err != nil {
		return fmt.Errorf("raft group %q: snapshot to %s: %w", t.group, target, err)
	}
	return decode(out.Msgpack, resp)
}

// AppendEntriesPipeline opens a stream to target on which AppendEntries are
// sent without waiting for each answer.
func (t *Transport) AppendEntriesPipeline(_ raft.ServerID, target raft.ServerAddress) (raft.AppendPipeline, error) {
	if err := t.isClosed(); err != nil {
		return nil, err
	}
	c, err := t.mux.client(target)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(t.ctx)
	stream, err := c.AppendEntriesPipeline(ctx)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("raft group %q: pipeline to %s: %w", t.group, target, err)
	}
	p := &pipeline{
		t: t, target: target, stream: stream, cancel: cancel,
		inflight: make(chan *appendFuture, pipelineDepth),
		done:     make(chan raft.AppendFuture, pipelineDepth),
		shutdown: make(chan struct{}),
	}
	go p.receive()
	return p, nil
}

type pipeline struct {
	t        *Transport
	target   raft.ServerAddress
	stream   grpc.BidiStreamingClient[transportpb.RPC, transportpb.RPC]
	cancel   context.CancelFunc
	sendMu   sync.Mutex // serialises Send and inflight order
	inflight chan *appendFuture
	done     chan raft.AppendFuture
	once     sync.Once
	shutdown chan struct{}
}

func (p *pipeline) AppendEntries(args *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) (raft.AppendFuture, error) {
	f := &appendFuture{start: time.Now(), args: args, resp: resp, errCh: make(chan error, 1)}
	// An idle append answered locally still queues behind those in
	// flight: raft reads the answers in order.
	f.local = p.t.answerDormant(args, resp) || p.t.answerIdle(p.target, args, resp)
	var in *transportpb.RPC
	if !f.local {
		var err error
		if in, err = p.t.mux.appendRPC(p.t.group, p.target, args); err != nil {
			return nil, err
		}
		f.binary = len(in.Append) > 0
	}
	p.sendMu.Lock()
	defer p.sendMu.Unlock()
	select {
	case p.inflight <- f:
	case <-p.shutdown:
		return nil, raft.ErrPipelineShutdown
	}
	if f.local {
		return f, nil
	}
	if err := p.stream.Send(in); err != nil {
		// receive fails every in-flight future once the stream breaks.
		return nil, fmt.Errorf("raft group %q: pipeline send: %w", p.t.group, err)
	}
	return f, nil
}

// receive answers in-flight appends in order. It never closes p.done: raft's
// decoder may still be reading it after Close, and a receive from a closed
// channel would hand it a nil future (raft's NetworkTransport does the same).
func (p *pipeline) receive() {
	var broken error
	for {
		var f *appendFuture
		select {
		case f = <-p.inflight:
		case <-p.shutdown:
			// Fail what is still queued.
			for {
				select {
				case f := <-p.inflight:
					f.respond(raft.ErrPipelineShutdown)
				default:
					return
				}
			}
		}
		if broken == nil && f.local {
			f.respond(nil)
			select {
			case p.done <- f:
			case <-p.shutdown:
			}
			continue
		}
		if broken == nil {
			msg, err := p.stream.Recv()
			if err != nil {
				broken = fmt.Errorf("raft group %q: pipeline: %w", p.t.group, err)
				if f.binary && status.Code(err) == codes.InvalidArgument {
					p.t.mux.forgetTakesAppend(p.target)
				}
			} else {
				p.t.mux.answered(p.target, msg)
				broken = decode(msg.Msgpack, f.resp)
				p.t.noteIdle(p.target, f.args, f.resp, f.start, broken)
				if broken == nil {
					f.respond(nil)
					select {
					case p.done <- f:
					case <-p.shutdown:
					}
					continue
				}
			}
		}
		p.t.noteIdle(p.target, f.args, f.resp, f.start, broken)
		f.respond(broken)
		select {
		case p.done <- f:
		case <-p.shutdown:
		}
	}
}

func (p *pipeline) Consumer() <-chan raft.AppendFuture { return p.done }

func (p *pipeline) Close() error {
	p.once.Do(func() {
		close(p.shutdown)
		p.sendMu.Lock()
		_ = p.stream.CloseSend()
		p.sendMu.Unlock()
		p.cancel()
	})
	return nil
}

type appendFuture struct {
	local  bool // answered by answerIdle, never sent
	binary bool // sent in the binary encoding
	start  time.Time
	args   *raft.AppendEntriesRequest
	resp   *raft.AppendEntriesResponse
	errCh  chan error
	err    error
	once   sync.Once
}

func (f *appendFuture) respond(err error) { f.errCh <- err }
func (f *appendFuture) Error() error {
	f.once.Do(func() { f.err = <-f.errCh })
	return f.err
}
func (f *appendFuture) Start() time.Time                      { return f.start }
func (f *appendFuture) Request() *raft.AppendEntriesRequest   { return f.args }
func (f *appendFuture) Response() *raft.AppendEntriesResponse { return f.resp }

// AppendEntriesPipeline answers a stream of AppendEntries in order.
func (s *muxServer) AppendEntriesPipeline(stream grpc.BidiStreamingServer[transportpb.RPC, transportpb.RPC]) error {
	for {
		in, err := stream.Recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		out, err := serveUnary[raft.AppendEntriesRequest](stream.Context(), s.m, in, true)
		if err != nil {
			return err
		}
		s.m.stats.PipelinedAppends.Add(1)
		if err := stream.Send(out); err != nil {
			return err
		}
	}
}

// InstallSnapshot hands Raft a reader over the incoming chunks.
func (s *muxServer) InstallSnapshot(stream grpc.ClientStreamingServer[transportpb.SnapshotChunk, transportpb.RPC]) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	if first.Group == "" {
		return status.Error(codes.InvalidArgument, "snapshot without a group")
	}
	t, err := s.m.lookupWait(stream.Context(), first.Group)
	if err != nil {
		return err
	}
	req := &raft.InstallSnapshotRequest{}
	if err := decode(first.Request, req); err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	pr, pw := io.Pipe()
	go func() {
		for {
			c, err := stream.Recv()
			if err == io.EOF {
				pw.Close()
				return
			}
			if err != nil {
				pw.CloseWithError(err)
				return
			}
			if _, err := pw.Write(c.Data); err != nil {
				return // the reader gave up; Raft's answer says why
			}
			s.m.stats.SnapshotBytes.Add(int64(len(c.Data)))
		}
	}()
	resp, err := t.dispatch(stream.Context(), req, pr)
	pr.Close()
	if err != nil {
		return err
	}
	out, err := encode(resp)
	if err != nil {
		return status.Error(codes.Internal, err.Error())
	}
	s.m.stats.SnapshotsReceived.Add(1)
	return stream.SendAndClose(&transportpb.RPC{Group: first.Group, Msgpack: out})
}
