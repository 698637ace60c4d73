package diskguard

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"
)

// ErrDiskFull: the node's data disk has less free space than its minimum;
// writes are refused until space returns.
var ErrDiskFull = errors.New("disk full")

// Config configures a Guard. Zero fields get the defaults of
// DefaultConfig.
type Config struct {
	// Dir is the directory whose file system is watched, and where the
	// reserve file lives.
	Dir string
	// NodeID names the node in errors ("disk full on n2").
	NodeID string
	// MinFree is the free space below which the Guard says full.
	MinFree uint64
	// Reserve is the size of the reserve file, deleted by Release; 0 keeps
	// none.
	Reserve uint64
	// Interval is how often free space is polled.
	Interval time.Duration
	Logger   hclog.Logger
}

// Defaults: the headroom covers Raft's own writes and a snapshot or two of
// a small shard.
const (
	DefaultMinFree  = 256 << 20
	DefaultReserve  = 64 << 20
	DefaultInterval = 200 * time.Millisecond
	// ReserveFile is the reserve's name in Dir.
	ReserveFile = "reserve"
)

// State is what the Guard last saw.
type State struct {
	Free, Total, MinFree uint64
	// Full: pushes are refused; Reason says why (or why free space is
	// unknown).
	Full   bool
	Reason string
	// ReserveReleased: the reserve file is deleted, its space given to the
	// node's writes.
	ReserveReleased bool
}

// Guard watches one directory's free space.
type Guard struct {
	cfg   Config
	state atomic.Pointer[State]

	mu       sync.Mutex // guards reserve creation and deletion, released
	released bool

	closed chan struct{}
	done   chan struct{}
}

// New starts a Guard: it creates the reserve file (if there is room above
// MinFree for it), takes a first reading and polls from then on.
func New(cfg Config) (*Guard, error) {
	if cfg.Dir == "" {
		return nil, errors.New("disk guard: Dir is empty")
	}
	if cfg.MinFree == 0 {
		cfg.MinFree = DefaultMinFree
	}
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	g := &Guard{cfg: cfg, closed: make(chan struct{}), done: make(chan struct{})}
	if _, _, err := statfs(cfg.Dir); err != nil {
		return nil, fmt.Errorf("disk guard: %w", err)
	}
	g.poll()
	go g.loop()
	return g, nil
}

// Close stops polling. The reserve file stays for the next start.
func (g *Guard) Close() {
	if g == nil {
		return
	}
	select {
	case <-g.closed:
	default:
		close(g.closed)
	}
	<-g.done
}

func (g *Guard) loop() {
	defer close(g.done)
	t := time.NewTicker(g.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-g.closed:
			return
		case <-t.C:
			g.poll()
		}
	}
}

func statfs(dir string) (free, total uint64, err error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, 0, fmt.Errorf("statfs %s: %w", dir, err)
	}
	bs := uint64(st.Bsize)
	return st.Bavail * bs, st.Blocks * bs, nil
}

// poll reads the free space, decides full or not (with hysteresis), and
// releases or recreates the reserve.
func (g *Guard) poll() {
	prev := g.state.Load()
	free, total, err := statfs(g.cfg.Dir)
	s := &State{Free: free, Total: total, MinFree: g.cfg.MinFree}
	wasFull := prev != nil && prev.Full
	switch {
	case err != nil:
		// Unknown is not full: a failing statfs must not stop writes that
		// the disk may well take. The reason says what is wrong.
		s.Free, s.Total, s.Full = 0, 0, false
		s.Reason = err.Error()
	case free < g.cfg.MinFree || (wasFull && free < g.resumeAt()):
		s.Full = true
		s.Reason = fmt.Sprintf("%s free of %s, below the minimum of %s", mib(free), mib(total), mib(g.cfg.MinFree))
		if wasFull && free >= g.cfg.MinFree {
			s.Reason = fmt.Sprintf("%s free of %s; pushes resume at %s", mib(free), mib(total), mib(g.resumeAt()))
		}
	}
	if err == nil && !s.Full {
		g.restoreReserve(free)
	}
	g.mu.Lock()
	s.ReserveReleased = g.released
	g.mu.Unlock()
	g.state.Store(s)
	switch {
	case s.Full && !wasFull:
		g.cfg.Logger.Error("disk full: refusing pushes until space returns", "dir", g.cfg.Dir, "free", mib(free), "min_free", mib(g.cfg.MinFree))
	case !s.Full && wasFull:
		g.cfg.Logger.Info("disk space is back: accepting pushes again", "dir", g.cfg.Dir, "free", mib(free))
	}
}

// resumeAt is the free space at which a full Guard says not full again.
func (g *Guard) resumeAt() uint64 { return g.cfg.MinFree + g.cfg.MinFree/4 }

// Check returns nil, or an error wrapping ErrDiskFull while the disk is
// below its minimum free space.
func (g *Guard) Check() error {
	s := g.state.Load()
	if s == nil || !s.Full {
		return nil
	}
	return fmt.Errorf("%w on %s: %s", ErrDiskFull, g.cfg.NodeID, s.Reason)
}

// Admit returns nil if n more bytes can be written with MinFree left,
// reading the free space afresh; else an error wrapping ErrDiskFull.
func (g *Guard) Admit(n int64) error {
	if err := g.Check(); err != nil {
		return err
	}
	free, _, err := statfs(g.cfg.Dir)
	if err != nil {
		return nil // unknown: see poll
	}
	if n < 0 || uint64(n)+g.cfg.MinFree > free {
		return fmt.Errorf("%w on %s: %s would leave less than the minimum of %s free (%s free)", ErrDiskFull, g.cfg.NodeID, mib(uint64(max(n, 0))), mib(g.cfg.MinFree), mib(free))
	}
	return nil
}

// State returns what the Guard last saw.
func (g *Guard) State() State {
	if s := g.state.Load(); s != nil {
		return *s
	}
	return State{MinFree: g.cfg.MinFree}
}

// Release deletes the reserve file, if there is one, so that the writes
// the node cannot refuse find room; it reports whether it freed anything.
// why goes to the log.
func (g *Guard) Release(why string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.released || g.cfg.Reserve == 0 {
		return false
	}
	p := filepath.Join(g.cfg.Dir, ReserveFile)
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		g.cfg.Logger.Error("deleting the disk reserve file", "path", p, "error", err)
		return false
	}
	g.released = true
	g.cfg.Logger.Warn("disk reserve released", "path", p, "bytes", mib(g.cfg.Reserve), "why", why)
	return true
}

// restoreReserve writes the reserve file if it is missing (first start, or
// released) and free space, of which it takes Reserve bytes, stays at
// resumeAt or above.
func (g *Guard) restoreReserve(free uint64) {
	if g.cfg.Reserve == 0 {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	p := filepath.Join(g.cfg.Dir, ReserveFile)
	if info, err := os.Stat(p); err == nil && uint64(info.Size()) >= g.cfg.Reserve {
		g.released = false
		return
	}
	if free < g.resumeAt()+g.cfg.Reserve {
		g.released = true
		return
	}
	if err := writeZeros(p, g.cfg.Reserve); err != nil {
		os.Remove(p)
		g.released = true
		g.cfg.Logger.Warn("cannot write the disk reserve file", "path", p, "error", err)
		return
	}
	if g.released {
		g.cfg.Logger.Info("disk reserve restored", "path", p, "bytes", mib(g.cfg.Reserve))
	}
	g.released = false
}

// writeZeros writes a file of n zero bytes and syncs it: zeros written,
// not a sparse file, so that deleting it frees real blocks.
func writeZeros(p string, n uint64) error {
	f, err := os.OpenFile(p, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	buf := make([]byte, 1<<20)
	for left := n; left > 0 && err == nil; {
		k := min(left, uint64(len(buf)))
		_, err = f.Write(buf[:k])
		left -= k
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

func mib(b uint64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }
