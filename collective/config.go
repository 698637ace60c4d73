package collective

import (
	"fmt"
	"net"
	"time"
)

// Algorithm selects how AllReduce runs.
type Algorithm uint8

const (
	// Auto uses recursive doubling for buffers of at most Config.SmallBytes
	// bytes and the ring above.
	Auto Algorithm = iota
	// Ring always uses the pipelined ring (reduce-scatter, then allgather).
	Ring
	// RecursiveDoubling always uses recursive doubling.
	RecursiveDoubling
)

func (a Algorithm) String() string {
	switch a {
	case Auto:
		return "auto"
	case Ring:
		return "ring"
	case RecursiveDoubling:
		return "recursive-doubling"
	}
	return fmt.Sprintf("Algorithm(%d)", uint8(a))
}

// Defaults.
const (
	// DefaultTimeout bounds the wait for any one message of an operation.
	DefaultTimeout = 10 * time.Second
	// DefaultJoinTimeout bounds Join when ctx has no earlier deadline.
	DefaultJoinTimeout = 60 * time.Second
	// DefaultChunkBytes is the ring's pipelining unit.
	DefaultChunkBytes = 512 << 10
	// DefaultSmallBytes is the largest buffer AllReduce sends through
	// recursive doubling under Auto (measured on loopback with
	// BenchmarkAllReduceCrossover; between 64 and 256 KiB the two were
	// about even for N = 2, 4, 8 on this 2-core machine).
	DefaultSmallBytes = 128 << 10
	// MaxRanks is the largest group size.
	MaxRanks = 64

	minChunkBytes = 4 << 10
	maxChunkBytes = 64 << 20
)

// Config describes one rank of a group. Every rank of a group must use the
// same Addrs, Job, Generation, ChunkBytes, SmallBytes and Algorithm: the
// handshake refuses a peer whose values differ.
type Config struct {
	// Rank of this process, 0 <= Rank < len(Addrs).
	Rank int
	// Addrs is the listen address of every rank, indexed by rank.
	Addrs []string
	// Job names the training job; peers of another job are refused.
	Job string
	// Generation numbers successive groups of one job. After a failure the
	// trainer joins a new group with a larger generation; a peer still in an
	// older generation is refused.
	Generation uint64
	// Timeout bounds the wait for any single message (a chunk, a handshake
	// reply) during an operation; a peer silent for longer fails the
	// operation. 0 means DefaultTimeout.
	Timeout time.Duration
	// JoinTimeout bounds Join (together with ctx). 0 means DefaultJoinTimeout.
	JoinTimeout time.Duration
	// ChunkBytes is the ring's pipelining unit and the broadcast chain's.
	// 0 means DefaultChunkBytes; rounded down to a multiple of 4; must be
	// within [4 KiB, 64 MiB].
	ChunkBytes int
	// SmallBytes: under Auto, AllReduce of at most this many bytes uses
	// recursive doubling, and Broadcast of at most this many bytes uses a
	// binomial tree. 0 means DefaultSmallBytes; negative means never.
	SmallBytes int
	// Algorithm forces an AllReduce algorithm; Auto chooses by size.
	Algorithm Algorithm
	// Listener, if set, is used instead of listening on Addrs[Rank]. Join
	// takes ownership and closes it once the group is formed.
	Listener net.Listener
}

// takeListener takes Listener out of c for the join, which owns it. If the
// join will not listen (a config error, a group of one, a quorum rank other
// than 0), it closes the listener and returns nil.
func (c *Config) takeListener(listen bool) net.Listener {
	ln := c.Listener
	c.Listener = nil
	if ln != nil && !listen {
		ln.Close()
		return nil
	}
	return ln
}

// withDefaults returns a copy of c with zero values filled in, or an error
// naming the offending field.
func (c Config) withDefaults() (Config, error) {
	c.Addrs = append([]string(nil), c.Addrs...)
	n := len(c.Addrs)
	switch {
	case n == 0:
		return c, fmt.Errorf("%w: Addrs is empty", ErrConfig)
	case n > MaxRanks:
		return c, fmt.Errorf("%w: len(Addrs) (%d) is more than MaxRanks (%d)", ErrConfig, n, MaxRanks)
	case c.Rank < 0 || c.Rank >= n:
		return c, fmt.Errorf("%w: Rank (%d) is not in [0, %d)", ErrConfig, c.Rank, n)
	case c.Timeout < 0:
		return c, fmt.Errorf("%w: Timeout (%s) is negative", ErrConfig, c.Timeout)
	case c.JoinTimeout < 0:
		return c, fmt.Errorf("%w: JoinTimeout (%s) is negative", ErrConfig, c.JoinTimeout)
	case c.Algorithm > RecursiveDoubling:
		return c, fmt.Errorf("%w: Algorithm (%d) is unknown", ErrConfig, c.Algorithm)
	case len(c.Job) > 1024:
		return c, fmt.Errorf("%w: Job is %d bytes, more than 1024", ErrConfig, len(c.Job))
	}
	for i, a := range c.Addrs {
		if a == "" && n > 1 {
			return c, fmt.Errorf("%w: Addrs[%d] is empty", ErrConfig, i)
		}
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.JoinTimeout == 0 {
		c.JoinTimeout = DefaultJoinTimeout
	}
	if c.ChunkBytes == 0 {
		c.ChunkBytes = DefaultChunkBytes
	}
	c.ChunkBytes &^= 3
	if c.ChunkBytes < minChunkBytes || c.ChunkBytes > maxChunkBytes {
		return c, fmt.Errorf("%w: ChunkBytes (%d) is not in [%d, %d]", ErrConfig, c.ChunkBytes, minChunkBytes, maxChunkBytes)
	}
	if c.SmallBytes == 0 {
		c.SmallBytes = DefaultSmallBytes
	}
	if c.SmallBytes < 0 {
		c.SmallBytes = -1
	}
	return c, nil
}
