// Package collective owns the collective operations among the trainer
// processes of one job: AllReduce (sum, mean) of a flat float32 buffer,
// Broadcast and Barrier, over persistent TCP connections. It stands alone:
// it imports no other raftps package. Rendezvous (finding the peers'
// addresses and assigning ranks) is the caller's: Join takes the address of
// every rank, indexed by rank.
//
// # Use
//
//  1. Every trainer calls Join with the same Addrs, Job and Generation and
//     its own Rank. Join returns once this rank is connected to every other.
//  2. The trainers call the same collective operations in the same order,
//     with buffers of the same length (and the same root for Broadcast).
//  3. Any error from an operation means the group is broken: the ranks are no
//     longer in step, and every later call returns ErrGroupBroken. The
//     trainer closes the Group, agrees with the survivors on a new list of
//     addresses, and Joins again with Generation+1. A rank still in the old
//     generation is refused by the new group.
//
// # Concurrency
//
// One operation at a time per Group. The methods may be called from any
// goroutine, but an operation started while another is running on the same
// Group fails at once with ErrBusy: queueing them could run them in
// different orders on different ranks. Close, Err, Rank, Size and Generation
// are safe at any time; Close makes a running operation fail with ErrClosed.
// The buffer passed to an operation belongs to the Group until it returns.
//
// # Algorithms
//
// AllReduce of at most Config.SmallBytes bytes (default 128 KiB, measured
// with BenchmarkAllReduceCrossover on loopback: recursive doubling wins below
// it for N = 4 and 8, the ring above) uses recursive doubling: log2(p)
// rounds in which partners r and r XOR 2^k exchange their whole buffer and
// add, p the largest power of two <= N. When N is not a power of two the
// first 2(N-p) ranks first pair up (even into odd), the even ones sit out and
// get the result at the end. Larger buffers use the ring: N-1 reduce-scatter
// steps then N-1 allgather steps, each moving one of N nearly equal segments
// to the next rank. Segments travel as frames of at most Config.ChunkBytes
// (default 512 KiB); one goroutine sends while another receives and
// reduces, and a chunk is forwarded to the next step as soon as it is
// reduced. Both ends put the frames of all steps on the wire in one fixed
// interleaved (wavefront) order, so the steps overlap and a chunk is
// forwarded while still in cache; the order of additions is the same as
// if the steps ran one after the other. Config.Algorithm forces either.
//
// Broadcast of at most SmallBytes bytes goes down a binomial tree; larger
// buffers down the chain root, root+1, ..., root-1, pipelined by chunk.
// Barrier is a dissemination barrier (ceil(log2 N) rounds of empty frames).
//
// # Determinism
//
// Every rank ends an AllReduce with bit-identical results. Ring: segment j
// is reduced once, along the chain of ranks j, j+1, ..., j-1 in that order,
// by the rank that owns it at each step; the last of them (which for Mean
// also divides by N) holds the result, and the allgather copies those bytes
// to everyone. Recursive doubling: both partners of an exchange add the same
// two values, always with the lower ranks' operand first, so they compute
// the same bits (IEEE addition is commutative; the fixed order covers NaN
// payloads too), and every Mean divides identical sums by the same N. The
// result depends on N, the buffer length, the algorithm and ChunkBytes only
// through the (fixed) order of additions: the same inputs give the same
// bits on every run. It is not, in general, bit-equal to a sequential sum
// in rank order, nor across the two algorithms.
//
// # Failures
//
// Every read and write has a deadline of Config.Timeout (default 10 s),
// capped by ctx's deadline, and cancelling ctx interrupts a blocked
// operation. A rank whose operation fails closes all its connections, so
// its peers fail at once (connection closed) rather than at their timeout:
// a dead or silent peer makes the operation fail on every surviving rank
// within about Timeout. The error is a *PeerError naming this rank, the
// operation and the peer whose connection failed (errors.Is ErrPeerFailed);
// a rank next to the dead one names it, a rank further away may name a
// survivor that aborted. Frames carry the operation, its sequence number
// and the buffer length, so ranks that call different operations or pass
// different lengths fail with ErrMismatch instead of corrupting data.
//
// # Wire format
//
// Full mesh: rank i dials every rank j < i at Addrs[j]; each pair shares one
// TCP connection, used in both directions. All integers are little-endian.
//
// Handshake. The dialer sends a hello; the acceptor checks it and answers
// with its own hello, status 0 (accepted) or 1 (refused, with a reason).
//
//	0  [4]byte "RPSC"        magic
//	4  uint16  1             version
//	6  uint16  status        0 hello/accepted, 1 refused
//	8  uint32  group size
//	12 uint32  sender's rank
//	16 uint32  rank the sender expects at the other end
//	20 uint32  ChunkBytes
//	24 uint64  Generation
//	32 int64   SmallBytes    (-1: never)
//	40 uint8   Algorithm
//	41 uint8   0
//	42 uint16  len(Job)
//	44 uint16  len(reason)   (refusals only, at most 1024)
//	46 uint16  0
//	48 Job, then reason
//
// A peer with another job, generation, group size, rank or algorithm
// settings is refused. A dialer refused by a peer of an older generation
// retries until JoinTimeout (that peer may be about to rejoin), and so does
// one whose handshake broke off (the reply never came); any other refusal
// fails Join at once with ErrRefused. The acceptor refuses strays and goes
// on waiting; if Join times out, its error lists the first eight refusals
// and broken handshakes.
//
// Data frames. Each message of an operation is a 16-byte header and a
// payload of float32s in little-endian order (IEEE 754 bits; on
// little-endian hosts sent and received through an unsafe byte view of the
// caller's slice, with no per-element work):
//
//	0  uint32 seq      operation number on this group, from 1
//	4  uint8  op       1 ring allreduce, 2 recursive-doubling allreduce,
//	                   3 broadcast, 4 barrier
//	5  uint8  aux      broadcast root, else 0
//	6  uint16 step     algorithm step
//	8  uint32 total    caller's buffer length in elements
//	12 uint32 nbytes   payload length in bytes
//
// The receiver checks every header field against what it expects. Buffers
// are limited to 2^32-1 elements.
//
// # Quorum steps (backup workers)
//
// JoinQuorum starts a separate primitive for synchronous SGD with backup
// workers (Chen et al. 2016, "Revisiting distributed synchronous SGD"):
// each step proceeds with the first Need of the N ranks' contributions and
// discards the late ones. It does not use a Group: rank 0 coordinates a star.
// Rank 0 listens on Addrs[0] (or QuorumConfig.Listener); every other rank
// dials it, and listens nowhere. Rank 0 also trains, through an in-process
// path to its coordinator.
//
// Each rank loops: Next returns the latest released step and its state (step
// 1 is Initial); the rank computes its contribution and Submits it; if it is
// among the first Need it is accepted, and the rank does the step's side
// effects (pushes its sparse gradients) and calls Done; a late contribution
// is rejected at once and the rank just calls Next, which gives it the
// newest release, skipping the ones it missed. Once Need contributions were
// accepted and each of those ranks called Done, rank 0 sums them in rank
// order, calls Update on a copy of the state, and releases step+1. After
// step Steps, step Steps+1 is the final release: Next returns it and the
// rank stops; rank 0's Close waits (at most Timeout) for every live rank to
// fetch it, so a rank still in the middle of the last step gets it too.
//
// Failures. A rank whose connection breaks is dropped; so is one that does
// not call Done within Timeout of its accepted Submit (its contribution
// still counts; its Done fails saying why). The others go on as long as at
// least Need ranks are left. With fewer, or when a released step does not
// collect Need contributions within StepTimeout (default Timeout), rank 0
// ends the run: it sends every rank an abort frame with the reason, and
// every pending and later call fails with ErrGroupBroken wrapping
// ErrQuorumLost. While a rank waits in Next, rank 0 sends a heartbeat every
// Timeout/3, so a dead or silent rank 0 makes every call fail within Timeout
// with a *PeerError naming rank 0; a rank 0 that closes before the final
// release ends the run for everyone. Every call honours ctx; on ranks other
// than 0 a call interrupted mid-exchange takes the rank out of the run.
// Misuse (wrong lengths, a step never released, Submit twice, Done without
// an accepted Submit, Next before Done) fails with ErrConfig and changes
// nothing.
//
// Quorum wire format. The handshake is the group's (the same code, with
// the same retries and refusals), with magic "RPSQ" and these fields: N, sender's rank, Need, Generation, Steps and the state
// length (rank 0's answer carries len(Initial); a rank may send 0 for "any");
// a rank whose values differ is refused. Then every message is a 16-byte
// header and a payload:
//
//	0  uint8  type     1 next, 2 submit, 3 done, 4 bye (rank to rank 0);
//	                   5 start, 6 release, 7 verdict, 8 done-ack, 9 ping,
//	                   10 abort (rank 0 to a rank)
//	1  uint8  flag     release: 1 final; verdict: 1 accepted; abort: reason code
//	2  uint16 0
//	4  uint32 nbytes   payload length
//	8  uint64 step     next: the last step the rank saw; else the step
//
// Submit and release carry the vector (little-endian float32s, the same
// unsafe byte view as above); abort carries the reason text. A rank has at
// most one request outstanding. Rank 0 sends start once every rank has
// joined; a rank sends bye as soon as it has the final release.
package collective
