package chain

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/raftps/raftps/replication"
	"github.com/raftps/raftps/replication/chain/chainpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// MaxMessageBytes bounds one chain message. A forward message carries
// whole entries (each at most MaxEntryBytes, which validate keeps at or below
// half of this) and is cut at batchBytes otherwise. The node's
// grpc.Server must accept it: replication.ServerOptions allows more.
const MaxMessageBytes = 64 << 20

// batchBytes is how many entry bytes one forward message carries, at
// least one entry whatever its size.
const batchBytes = 4 << 20

// MaxForwardEntries is how many entries one forward message carries at
// most, so that a message of small entries stays far below the element
// limit of the peer listener (shard.PeerMaxElements).
const MaxForwardEntries = 1 << 14

// Limits of the Read RPC a member sends the tail for its dirty keys: the
// most keys one Read carries, and the most answer bytes (keys × dim × 4;
// MaxMessageBytes less room for the rest of the answer). The tail refuses
// a larger Read before it allocates the answer; a member with more keys
// sends several (tailRead).
const (
	MaxReadKeys        = 1 << 20
	maxReadAnswerBytes = MaxMessageBytes - 1<<20
)

// readChunk is how many keys of dim values one Read may carry.
func readChunk(dim int) int { return max(1, min(MaxReadKeys, maxReadAnswerBytes/(4*dim))) }

// MuxConfig configures a Mux; zero fields get defaults.
type MuxConfig struct {
	// LocalAddr is this node's gRPC address, as peers dial it.
	LocalAddr string
	// DialOptions are used to dial peers (default: insecure credentials).
	DialOptions []grpc.DialOption
	// Authorize, if set, is asked before a chain replica sees a message:
	// with the group and, for a replication stream, the sender its first
	// message claims (a peer address; the chain then checks that it is
	// its predecessor), or "" for a read (the caller must be in the chain).
	// A non-nil error refuses the call; it should be a gRPC status error.
	Authorize func(ctx context.Context, group, from string) error
	Logger    hclog.Logger
}

// Mux is one node's chain transport: it serves the chain RPCs of every
// chain replica on the node's gRPC server (service raftps.chain.v1.Chain,
// see chainpb) and holds one client connection per peer, shared by every
// group. Messages name their group; the Mux routes them.
//
// Concurrency: all methods are safe for concurrent use. mu guards chains and
// closed; connMu guards conns.
type Mux struct {
	cfg MuxConfig

	mu     sync.RWMutex
	chains map[string]*Chain
	closed bool

	connMu sync.Mutex
	conns  map[string]*grpc.ClientConn
}

// NewMux returns a Mux for the node at cfg.LocalAddr.
func NewMux(cfg MuxConfig) (*Mux, error) {
	if cfg.LocalAddr == "" {
		return nil, fmt.Errorf("chain transport: LocalAddr is empty")
	}
	if cfg.DialOptions == nil {
		cfg.DialOptions = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	cfg.DialOptions = append(cfg.DialOptions, grpc.WithDefaultCallOptions(
		grpc.MaxCallRecvMsgSize(MaxMessageBytes), grpc.MaxCallSendMsgSize(MaxMessageBytes)))
	// Keepalive: a successor stopped or cut off without a TCP reset would
	// otherwise leave the forwarding stream blocked on flow control for ever.
	cfg.DialOptions = append(cfg.DialOptions, replication.PeerDialOptions()...)
	return &Mux{cfg: cfg, chains: map[string]*Chain{}, conns: map[string]*grpc.ClientConn{}}, nil
}

// Register adds the chain service to the node's gRPC server.
func (m *Mux) Register(s grpc.ServiceRegistrar) {
	chainpb.RegisterChainServer(s, &server{m: m})
}

func (m *Mux) add(c *Chain) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return fmt.Errorf("chain %q: %w", c.cfg.ID, replication.ErrTransportClosed)
	}
	if _, ok := m.chains[c.cfg.ID]; ok {
		return fmt.Errorf("chain %q: %w", c.cfg.ID, replication.ErrGroupExists)
	}
	m.chains[c.cfg.ID] = c
	return nil
}

func (m *Mux) remove(c *Chain) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.chains[c.cfg.ID] == c {
		delete(m.chains, c.cfg.ID)
	}
}

func (m *Mux) lookup(group string) *Chain {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.chains[group]
}

// conn returns the node's one connection to the peer at target.
func (m *Mux) conn(target string) (*grpc.ClientConn, error) {
	m.mu.RLock()
	closed := m.closed
	m.mu.RUnlock()
	if closed {
		return nil, fmt.Errorf("chain transport: dialing %s: %w", target, replication.ErrTransportClosed)
	}
	m.connMu.Lock()
	defer m.connMu.Unlock()
	cc, ok := m.conns[target]
	if !ok {
		var err error
		if cc, err = grpc.NewClient(target, m.cfg.DialOptions...); err != nil {
			return nil, fmt.Errorf("chain transport: dialing %s: %w", target, err)
		}
		m.conns[target] = cc
	}
	return cc, nil
}

// Close closes every connection. Close the node's chains first.
func (m *Mux) Close() error {
	m.mu.Lock()
	m.closed = true
	m.mu.Unlock()
	m.connMu.Lock()
	defer m.connMu.Unlock()
	var errs []error
	for _, cc := range m.conns {
		errs = append(errs, cc.Close())
	}
	m.conns = map[string]*grpc.ClientConn{}
	return errors.Join(errs...)
}

// The one table between the package's errors and the wire's codes.
var codeErrors = []struct {
	code chainpb.Code
	err  error
}{
	{chainpb.Code_STALE_EPOCH, ErrStaleEpoch},
	{chainpb.Code_EPOCH_AHEAD, ErrEpochAhead},
	{chainpb.Code_NOT_TAIL, ErrNotTail},
	{chainpb.Code_NOT_MEMBER, ErrNotMember},
	{chainpb.Code_UNKNOWN_GROUP, ErrUnknownGroup},
	{chainpb.Code_UNKNOWN_GROUP, replication.ErrGroupClosed}, // maps back to ErrUnknownGroup: the first match wins
	{chainpb.Code_BROKEN, ErrReplicaBroken},
	{chainpb.Code_BAD_REQUEST, replication.ErrBadRequest},
	{chainpb.Code_NOT_PREDECESSOR, ErrStaleEpoch},
	{chainpb.Code_NOT_READY, ErrNotReady},
}

// codeOf returns the wire code of err (BAD_REQUEST for an unknown error).
func codeOf(err error) chainpb.Code {
	if err == nil {
		return chainpb.Code_OK
	}
	if errors.Is(err, errNotPredecessor) {
		return chainpb.Code_NOT_PREDECESSOR
	}
	for _, e := range codeErrors {
		if errors.Is(err, e.err) {
			return e.code
		}
	}
	return chainpb.Code_BAD_REQUEST
}

// codeError turns a refusal from peer back into an error that wraps the
// package's sentinel.
func codeError(peer string, code chainpb.Code, msg string) error {
	for _, e := range codeErrors {
		if e.code == code {
			return fmt.Errorf("%s refused: %w (%s)", peer, e.err, msg)
		}
	}
	return fmt.Errorf("%s refused with code %s: %s", peer, code, msg)
}

// errNotPredecessor: a stream came from a node that is not this replica's
// predecessor in the same epoch (a configuration the sender has not caught
// up with, or a stale one). Wire code NOT_PREDECESSOR, mapped back to
// ErrStaleEpoch.
var errNotPredecessor = fmt.Errorf("%w: sender is not this replica's predecessor", ErrStaleEpoch)

// server answers the chain RPCs of every group on the node. Handlers
// only route: the work is in the Chain's methods.
type server struct {
	chainpb.UnimplementedChainServer
	m *Mux
}

func (s *server) Replicate(stream grpc.BidiStreamingServer[chainpb.Forward, chainpb.Ack]) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	if a := s.m.cfg.Authorize; a != nil {
		if first.From == "" {
			return status.Errorf(codes.InvalidArgument, "chain %q: a replication stream that names no sender", first.Group)
		}
		if err := a(stream.Context(), first.Group, first.From); err != nil {
			return err
		}
	}
	c := s.m.lookup(first.Group)
	if c == nil {
		err := fmt.Errorf("chain %q is not on node %s: %w", first.Group, s.m.cfg.LocalAddr, ErrUnknownGroup)
		return stream.Send(&chainpb.Ack{Code: codeOf(err), Error: err.Error()})
	}
	return c.serveReplicate(stream, first)
}

func (s *server) Read(ctx context.Context, req *chainpb.ReadRequest) (*chainpb.ReadResponse, error) {
	if a := s.m.cfg.Authorize; a != nil {
		if err := a(ctx, req.Group, ""); err != nil {
			return nil, err
		}
	}
	c := s.m.lookup(req.Group)
	if c == nil {
		err := fmt.Errorf("chain %q is not on node %s: %w", req.Group, s.m.cfg.LocalAddr, ErrUnknownGroup)
		return &chainpb.ReadResponse{Code: codeOf(err), Error: err.Error()}, nil
	}
	if len(req.Keys)%8 != 0 {
		return nil, status.Errorf(codes.InvalidArgument, "keys field of %d bytes is not whole u64s", len(req.Keys))
	}
	if n, dim := len(req.Keys)/8, c.cfg.Table.Dim; n > readChunk(dim) {
		return nil, status.Errorf(codes.ResourceExhausted, "chain read of %d keys of dim %d; the limit is %d keys per read (MaxReadKeys %d, at most %d answer bytes)",
			n, dim, readChunk(dim), MaxReadKeys, maxReadAnswerBytes)
	}
	return c.serveRead(req), nil
}

// tailRead asks the tail at addr, in epoch, for the rows of keys, in
// Reads of at most readChunk keys; it returns the least applied index the
// tail answered with.
func (m *Mux) tailRead(ctx context.Context, timeout time.Duration, addr, group string, epoch uint64, keys []uint64, out []float32) (uint64, error) {
	if len(keys) == 0 {
		return 0, nil
	}
	dim := len(out) / len(keys)
	chunk := readChunk(dim)
	var ix uint64
	for i := 0; i < len(keys); i += chunk {
		j := min(i+chunk, len(keys))
		cix, err := m.tailReadOne(ctx, timeout, addr, group, epoch, keys[i:j], out[i*dim:j*dim])
		if err != nil {
			return 0, err
		}
		if i == 0 || cix < ix {
			ix = cix
		}
	}
	return ix, nil
}

// tailReadOne is one Read of tailRead.
func (m *Mux) tailReadOne(ctx context.Context, timeout time.Duration, addr, group string, epoch uint64, keys []uint64, out []float32) (uint64, error) {
	cc, err := m.conn(addr)
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	resp, err := chainpb.NewChainClient(cc).Read(ctx, &chainpb.ReadRequest{Group: group, Epoch: epoch, Keys: replication.KeysBytes(keys)})
	if err != nil {
		return 0, fmt.Errorf("chain %s: read from tail %s: %w", group, addr, err)
	}
	if resp.Code != chainpb.Code_OK {
		return 0, fmt.Errorf("chain %s: read from tail: %w", group, codeError(addr, resp.Code, resp.Error))
	}
	if len(resp.Rows) != len(out)*4 {
		return 0, fmt.Errorf("chain %s: tail %s answered %d bytes of rows for %d values", group, addr, len(resp.Rows), len(out))
	}
	copy(replication.ValuesBytes(out), resp.Rows)
	return resp.AppliedIndex, nil
}
