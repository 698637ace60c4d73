package store

import "errors"

// Sentinel errors. Every error the package returns wraps exactly one of these,
// so callers (the gRPC edge in particular) can map them with errors.Is while the
// message still names the table, position, field or value at fault.
var (
	// ErrInvalidConfig: a table config field is out of range or unparsable.
	ErrInvalidConfig = errors.New("invalid table config")
	// ErrUnknownTable: no table of that name exists in the Store.
	ErrUnknownTable = errors.New("unknown table")
	// ErrTableExists: CreateTable with a name already in use.
	ErrTableExists = errors.New("table already exists")
	// ErrDimMismatch: a buffer's length does not match keys × dim.
	ErrDimMismatch = errors.New("dimension mismatch")
	// ErrNonFinite: a gradient, a summed gradient or an updated row is NaN or ±Inf.
	ErrNonFinite = errors.New("non-finite value")
	// ErrTableFull: the table has used all 2^32-1 row slots.
	ErrTableFull = errors.New("table full")
	// ErrCorruptSnapshot: a snapshot stream is truncated, fails a checksum or
	// describes an impossible state.
	ErrCorruptSnapshot = errors.New("corrupt snapshot")
	// ErrSnapshotVersion: a snapshot stream of a format version this build cannot read.
	ErrSnapshotVersion = errors.New("unsupported snapshot version")
	// ErrConfigMismatch: Restore of a snapshot taken from a table with another config.
	ErrConfigMismatch = errors.New("snapshot config does not match table")
	// ErrSnapshotReleased: use of a Snapshot after Release.
	ErrSnapshotReleased = errors.New("snapshot released")
)
