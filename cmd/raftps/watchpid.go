package main

import (
	"errors"
	"fmt"
	"syscall"
	"time"
)

// pollExited is exited by signal 0 once a second. A zombie still answers
// it, so the watch ends when the process is reaped.
func pollExited(pid int) (<-chan struct{}, error) {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return nil, fmt.Errorf("no process %d", pid)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range time.Tick(time.Second) {
			if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
				return
			}
		}
	}()
	return done, nil
}
