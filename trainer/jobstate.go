package trainer

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// A job keeps what outlives its trainer processes in two raftps tables of
// dimension StateDim, so it is replicated like the embeddings and survives
// any trainer's death:
//
//   - the state table (optimizer assign: a push stores the pushed row) holds
//     every trainer's clock (the last step it finished: SSP waits on them and
//     a restarted asynchronous trainer resumes after its own), the dense
//     checkpoint of synchronous training, and the marker that the dense table
//     was initialised;
//   - the dense table (optimizer sgd:lr=1, zeros) holds the dense parameters
//     of asynchronous and SSP training, where no allreduce keeps the
//     trainers' copies equal: each trainer pulls them every step and pushes
//     DenseLR times its dense gradient, which the servers subtract.
//
// Values are float32, so step numbers are exact up to 2^24 (MaxSteps).
const (
	// StateDim is the row length of a job's state and dense tables.
	StateDim = 256
	// MaxSteps is the largest step a job can record exactly.
	MaxSteps = 1 << 24

	stateClock      = 1 << 56 // | rank
	stateCkptHeader = 2 << 56
	stateCkptChunk  = 3 << 56 // | slot<<32 | chunk
	stateDenseInit  = 4 << 56
)

// StateTableOptimizer and DenseTableOptimizer are the optimizers a job's
// tables must be created with (zeros initializer, dim StateDim).
const (
	StateTableOptimizer = "assign"
	DenseTableOptimizer = "sgd:lr=1"
)

// jobState reads and writes a job's state table.
type jobState struct {
	ps    ParamServer
	table string
	row   []float32 // scratch of StateDim
}

func newJobState(ps ParamServer, table string) *jobState {
	return &jobState{ps: ps, table: table, row: make([]float32, StateDim)}
}

// chunks is how many StateDim rows hold n values.
func chunks(n int) int { return (n + StateDim - 1) / StateDim }

// pushRows stores values (padded with zeros) in the rows keys.
func pushRows(ctx context.Context, ps ParamServer, table string, keys []uint64, values []float32) error {
	buf := make([]float32, len(keys)*StateDim)
	copy(buf, values)
	return ps.Push(ctx, table, keys, buf)
}

// pullRows reads the rows keys and returns their first n values.
func pullRows(ctx context.Context, ps ParamServer, table string, keys []uint64, n int) ([]float32, error) {
	buf := make([]float32, len(keys)*StateDim)
	if err := ps.Pull(ctx, table, keys, buf); err != nil {
		return nil, err
	}
	return buf[:n], nil
}

func chunkKeys(base uint64, n int) []uint64 {
	keys := make([]uint64, chunks(n))
	for i := range keys {
		keys[i] = base | uint64(i)
	}
	return keys
}

// setClock records that rank finished step.
func (j *jobState) setClock(ctx context.Context, rank, step int) error {
	clear(j.row)
	j.row[0] = float32(step)
	if err := j.ps.Push(ctx, j.table, []uint64{stateClock | uint64(rank)}, j.row); err != nil {
		return fmt.Errorf("recording the clock of trainer %d: %w", rank, err)
	}
	return nil
}

// clocks returns the last step every rank finished.
func (j *jobState) clocks(ctx context.Context, world int) ([]int, error) {
	keys := make([]uint64, world)
	for r := range keys {
		keys[r] = stateClock | uint64(r)
	}
	buf := make([]float32, world*StateDim)
	if err := j.ps.Pull(ctx, j.table, keys, buf); err != nil {
		return nil, fmt.Errorf("reading the trainers' clocks: %w", err)
	}
	out := make([]int, world)
	for r := range out {
		out[r] = int(buf[r*StateDim])
	}
	return out, nil
}

// checkpoint is a stored copy of the dense parameters after step Step.
type checkpoint struct {
	Version int
	Step    int
	Dense   []float32
}

// The header row is [version, step, len(dense)]. A checkpoint goes to slot
// version%2 and the header is written only once all its chunks are stored,
// so a trainer that dies half-way leaves the previous checkpoint, in the
// other slot, intact and named by the header.

// readCheckpoint returns the latest checkpoint, or ok false if there is none.
func (j *jobState) readCheckpoint(ctx context.Context) (c checkpoint, ok bool, err error) {
	h, err := pullRows(ctx, j.ps, j.table, []uint64{stateCkptHeader}, 3)
	if err != nil {
		return c, false, fmt.Errorf("reading the checkpoint header: %w", err)
	}
	c.Version, c.Step = int(h[0]), int(h[1])
	n := int(h[2])
	if c.Version == 0 {
		return c, false, nil
	}
	if n < 0 || n > 1<<24 || c.Step < 0 {
		return c, false, fmt.Errorf("checkpoint header %v is corrupt", h)
	}
	c.Dense, err = pullRows(ctx, j.ps, j.table, chunkKeys(stateCkptChunk|uint64(c.Version%2)<<32, n), n)
	if err != nil {
		return c, false, fmt.Errorf("reading checkpoint %d: %w", c.Version, err)
	}
	return c, true, nil
}

// writeCheckpoint stores dense as the checkpoint after step, one version
// after prev (0: none).
func (j *jobState) writeCheckpoint(ctx context.Context, prev, step int, dense []float32) (version int, err error) {
	version = prev + 1
	if version >= MaxSteps || step >= MaxSteps {
		return prev, fmt.Errorf("checkpoint %d after step %d: the state table records at most %d", version, step, MaxSteps)
	}
	if err := pushRows(ctx, j.ps, j.table, chunkKeys(stateCkptChunk|uint64(version%2)<<32, len(dense)), dense); err != nil {
		return prev, fmt.Errorf("writing checkpoint %d: %w", version, err)
	}
	clear(j.row)
	j.row[0], j.row[1], j.row[2] = float32(version), float32(step), float32(len(dense))
	if err := j.ps.Push(ctx, j.table, []uint64{stateCkptHeader}, j.row); err != nil {
		return prev, fmt.Errorf("writing the header of checkpoint %d: %w", version, err)
	}
	return version, nil
}

// denseTable is the dense parameters of an asynchronous job, in a table.
type denseTable struct {
	ps      ParamServer
	table   string
	keys    []uint64
	buf     []float32 // pulled rows, len(keys)*StateDim
	pushBuf []float32 // pushed rows (a pull may run meanwhile, prefetching)
	n       int
}

func newDenseTable(ps ParamServer, table string, n int) *denseTable {
	keys := chunkKeys(0, n)
	return &denseTable{ps: ps, table: table, keys: keys, buf: make([]float32, len(keys)*StateDim), pushBuf: make([]float32, len(keys)*StateDim), n: n}
}

// pull copies the current dense parameters into dense.
func (d *denseTable) pull(ctx context.Context, dense []float32) error {
	if err := d.ps.Pull(ctx, d.table, d.keys, d.buf); err != nil {
		return fmt.Errorf("pulling the dense parameters: %w", err)
	}
	copy(dense, d.buf[:d.n])
	return nil
}

// push subtracts step (already multiplied by the learning rate) from the
// dense parameters on the servers.
func (d *denseTable) push(ctx context.Context, step []float32) error {
	copy(d.pushBuf, step) // the tail past n stays zero
	if err := d.ps.Push(ctx, d.table, d.keys, d.pushBuf); err != nil {
		return fmt.Errorf("pushing the dense step: %w", err)
	}
	return nil
}

// initDense makes the dense table hold init, once per job: rank 0 pushes
// -init onto the zero rows (0 - (-v) is exactly v) and then sets the marker;
// the other ranks wait for the marker. A rank 0 that died between the two
// pushes would apply -init twice on restart, so the marker is checked with
// the rows: rows that are not all zero without the marker mean exactly
// that, and are reported rather than silently trained on.
func (j *jobState) initDense(ctx context.Context, rank int, d *denseTable, init []float32, poll time.Duration) error {
	for {
		m, err := pullRows(ctx, j.ps, j.table, []uint64{stateDenseInit}, 1)
		if err != nil {
			return fmt.Errorf("reading the dense-initialised marker: %w", err)
		}
		if m[0] == 1 {
			return nil
		}
		if rank != 0 {
			select {
			case <-ctx.Done():
				return fmt.Errorf("waiting for trainer 0 to initialise the dense table: %w", ctx.Err())
			case <-time.After(poll):
			}
			continue
		}
		cur := make([]float32, d.n)
		if err := d.pull(ctx, cur); err != nil {
			return err
		}
		for i, v := range cur {
			if v != 0 {
				return fmt.Errorf("%w: dense table %s holds values (parameter %d = %v) but was never marked initialised: a trainer 0 died while initialising it; start the job under another name", ErrJobState, d.table, i, v)
			}
		}
		neg := make([]float32, d.n)
		for i, v := range init {
			neg[i] = -v
		}
		if err := d.push(ctx, neg); err != nil {
			return fmt.Errorf("initialising the dense table: %w", err)
		}
		clear(j.row)
		j.row[0] = 1
		if err := j.ps.Push(ctx, j.table, []uint64{stateDenseInit}, j.row); err != nil {
			return fmt.Errorf("marking the dense table initialised: %w", err)
		}
		return nil
	}
}

// ErrJobState is returned when a job's state tables hold something Train
// cannot resume from.
var ErrJobState = errors.New("trainer: job state")
