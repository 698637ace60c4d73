package replication

import (
	"time"

	"github.com/hashicorp/raft"
)

// awaitPoll is how often Await looks whether raft has shut down.
const awaitPoll = 20 * time.Millisecond

// Await waits for f, a future of r, and returns its error, or
// raft.ErrRaftShutdown once r has shut down without answering it.
//
// hashicorp/raft (v1.7.3) can leave a future unanswered for ever:
// VerifyLeader and LeadershipTransfer queue into buffered channels, and a
// call that races with Shutdown can queue after the loop that would answer
// it has exited (the call's select finds the shutdown channel closed and the
// buffer free, and may pick either). The futures never watch for shutdown
// themselves. So Error on such a future blocks for ever, and whatever waits
// for the caller (Node.Close) with it. Call Await instead of Error for those
// two; the futures raft answers as it shuts down (Apply, Barrier,
// configuration changes: unbuffered channels) do not need it.
//
// When raft shuts down first, the goroutine waiting on f stays blocked: one
// per call lost in that race.
func Await(r *raft.Raft, f raft.Future) error {
	done := make(chan error, 1)
	go func() { done <- f.Error() }()
	t := time.NewTicker(awaitPoll)
	defer t.Stop()
	for {
		select {
		case err := <-done:
			return err
		case <-t.C:
			if r.State() == raft.Shutdown {
				select {
				case err := <-done:
					return err
				default:
					return raft.ErrRaftShutdown
				}
			}
		}
	}
}
