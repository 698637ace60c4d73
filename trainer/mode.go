package trainer

import (
	"fmt"
	"strconv"
	"strings"
)

// ModeKind is how trainers of a job wait for one another.
type ModeKind uint8

const (
	// Sync: every step waits for every trainer (or, with backup workers,
	// for the first N-B); the pushes of a step are applied before any
	// trainer pulls for the next, and the dense gradient is averaged by
	// allreduce, so every trainer holds the same dense parameters.
	Sync ModeKind = iota
	// Async: no trainer waits for another. The dense parameters live in a
	// table like the embeddings; each trainer pulls them and pushes its
	// dense step every step, and prefetches the next batch's rows while it
	// computes the current one.
	Async
	// SSP (stale synchronous parallel): as Async, but a trainer starts step
	// t only once every trainer has finished step t-1-Staleness, by the
	// clocks the job keeps in the cluster. SSP with staleness 0 waits like
	// Sync without its barrier per step.
	SSP
)

// Mode is a training mode: sync, async or ssp:S.
type Mode struct {
	Kind ModeKind
	// Staleness is SSP's S: how many steps a trainer may run ahead of the
	// slowest.
	Staleness int
}

func (m Mode) String() string {
	switch m.Kind {
	case Sync:
		return "sync"
	case Async:
		return "async"
	case SSP:
		return "ssp:" + strconv.Itoa(m.Staleness)
	}
	return fmt.Sprintf("Mode(%d)", m.Kind)
}

// ParseMode reads "sync", "async" or "ssp:S" with S >= 0.
func ParseMode(s string) (Mode, error) {
	switch {
	case s == "sync":
		return Mode{Kind: Sync}, nil
	case s == "async":
		return Mode{Kind: Async}, nil
	case strings.HasPrefix(s, "ssp:"):
		n, err := strconv.Atoi(s[len("ssp:"):])
		if err != nil || n < 0 || n > MaxSteps {
			return Mode{}, fmt.Errorf("trainer: mode %q: want ssp:S with S a whole number of steps from 0 to %d", s, MaxSteps)
		}
		return Mode{Kind: SSP, Staleness: n}, nil
	}
	return Mode{}, fmt.Errorf("trainer: mode %q: want sync, async or ssp:S", s)
}
