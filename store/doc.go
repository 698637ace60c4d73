// Package store is raftps's in-memory table engine: the rows of one shard of an
// embedding table, the optimizers that update them, and snapshots of them. It
// is the state machine every replica of a shard runs, so it is deterministic
// and pure: no I/O but the io.Reader/io.Writer it is handed, no clock, no
// goroutines of its own.
//
// # What it owns
//
//   - TableConfig: name, dim (1..4096), initializer (zeros, uniform:a,
//     normal:sigma), optimizer (sgd, adagrad, adam, ftrl with
//     hyper-parameters; assign, which stores the pushed vector, for values
//     that are not gradients), seed; validated with errors that name the field and value.
//   - Table: rows keyed by uint64, each dim float32 values plus the
//     optimizer's state, stored in 1 MiB float32 chunks with a pointer-free
//     index, so ten million rows are a few thousand heap objects the garbage
//     collector never scans.
//   - Apply (push gradients), Lookup (pull rows), Snapshot/Load/Restore,
//     Checksum and MemoryBytes.
//   - Store: tables by name.
//   - bfloat16 gradients (bf16.go): rounding float32 to bfloat16 and widening
//     it back, in integer arithmetic on the bits, for tables whose pushes
//     travel and are logged in half the bytes; rows stay float32.
//
// # Determinism
//
// Replicas that apply the same batches in the same order hold bit-identical
// rows on any CPU. Apply sums a key's duplicate gradients in batch order and
// updates keys in order of first occurrence; the optimizers use float32 with
// explicit conversions that forbid fused multiply-add, and no transcendental
// functions (see optim.go); initial values are a pure function of (seed, key,
// column), so they are computed, not replicated, and a Lookup of a missing key
// returns them without creating the row.
//
// # Errors
//
// Every error wraps one sentinel of errors.go. A rejected Apply (wrong length,
// NaN or Inf gradient, overflowing sum or update) changes nothing; a rejected
// Restore leaves the table as it was.
//
// # Concurrency
//
//   - All methods of Table, Snapshot and Store are safe for concurrent use.
//   - Apply and Restore are serialised against each other. Apply computes new
//     rows without blocking readers and takes the write lock only to copy them
//     in: a Lookup sees each Apply entirely or not at all.
//   - Snapshot is O(1). Its reader (WriteTo or Checksum) runs alongside
//     Applies; each Apply copies, before changing it, a row an open snapshot
//     has not read yet (copy-on-write per row). An Apply waits for a snapshot
//     for at most one 256 KiB block copy.
//   - A Snapshot must be Released; until then Applies keep copies for it.
package store
