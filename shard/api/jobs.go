package api

import (
	"fmt"
	"unicode/utf8"
)

// Limits of a JoinJob request. They bound a job's state, which every waiting
// trainer polls and every metadata snapshot holds.
const (
	MaxJobWorld   = 64
	MaxJobNameLen = 128
	MaxJobAddrLen = 256
)

// CheckJobName validates a job name, in requests and log entries alike.
func CheckJobName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%w: job name is empty", ErrBadRequest)
	case len(name) > MaxJobNameLen:
		return fmt.Errorf("%w: job name of %d bytes is longer than %d", ErrBadRequest, len(name), MaxJobNameLen)
	case !utf8.ValidString(name):
		return fmt.Errorf("%w: job name is not UTF-8", ErrBadRequest)
	}
	return nil
}

// CheckJoin validates a join's arguments. The client calls it before
// converting world and rank to the wire's narrower types, the node on the
// request, and the metadata state machine again on the log entry, so a bad
// entry (written by another version, say) fails alike on every replica.
func CheckJoin(job string, world, rank int, addr string) error {
	if err := CheckJobName(job); err != nil {
		return err
	}
	switch {
	case world < 1 || world > MaxJobWorld:
		return fmt.Errorf("%w: job %q: world size %d is not within 1 to %d", ErrBadRequest, job, world, MaxJobWorld)
	case rank < -1 || rank >= world:
		return fmt.Errorf("%w: job %q: rank %d is not within 0 to %d (or -1 for any free rank)", ErrBadRequest, job, rank, world-1)
	case addr == "":
		return fmt.Errorf("%w: job %q: the trainer's address is empty", ErrBadRequest, job)
	case len(addr) > MaxJobAddrLen:
		return fmt.Errorf("%w: job %q: address of %d bytes is longer than %d", ErrBadRequest, job, len(addr), MaxJobAddrLen)
	case !utf8.ValidString(addr):
		return fmt.Errorf("%w: job %q: address is not UTF-8", ErrBadRequest, job)
	}
	return nil
}
