// Package diskguard watches the free space of a node's data directory so
// that a full disk stops writes, never the node (docs/RELIABILITY.md, "Full
// disk").
//
// # What it owns
//
// A Guard polls the file system of its directory (statfs) every Interval.
// Below MinFree bytes free it is full: Check answers ErrDiskFull ("disk full
// on n2: ...") and the node refuses pushes with it, and its followers take
// no new log entries, until the free space is back to MinFree plus a quarter
// (hysteresis, so that a disk at the edge does not flap). It then resumes by
// itself, as etcd's NOSPACE alarm does, but without an operator's disarm.
//
// The free space MinFree keeps is headroom for the writes the node cannot
// refuse: Raft's term and vote (hashicorp/raft panics when it cannot save
// its current term), the metadata group, snapshots of the state it holds.
// For a disk filled by someone else, the Guard also keeps a reserve file
// (Reserve bytes, DataDir/reserve) that it deletes only when a write the
// node cannot refuse (a Raft term or vote) has failed for lack of space
// (Release), so that the retried write, not whoever filled the disk, gets
// the space; it recreates the file once space is back.
//
// Admit answers whether n more bytes (a snapshot about to be received) fit
// above MinFree, from a fresh statfs.
//
// # Concurrency
//
// Check, Admit, Release and State are safe for concurrent use and cheap
// (Check and State read an atomic pointer). One goroutine polls; Close stops
// it. Release and the poller take mu to create or delete the reserve file.
package diskguard
