package localcluster

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
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

// Children are processes of this program's own binary that StartChildren
// started, each getting SIGTERM if this process dies.
type Children struct {
	cmds []*exec.Cmd
	outs []*bytes.Buffer
}

// StartChildren runs this program's binary once per argument list, their
// stderr to stderr and their stdout kept for Wait. If one fails to start,
// those started are killed.
func StartChildren(argv [][]string, stderr io.Writer) (*Children, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	c := &Children{}
	for i, args := range argv {
		cmd := exec.Command(self, args...)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, stderr
		DieWithParent(cmd)
		if err := cmd.Start(); err != nil {
			for _, started := range c.cmds {
				_ = started.Process.Kill()
			}
			return nil, fmt.Errorf("starting child %d: %w", i+1, err)
		}
		c.cmds, c.outs = append(c.cmds, cmd), append(c.outs, &out)
	}
	return c, nil
}

// Wait waits for every child and returns each one's stdout, nil for those
// that failed (named in the error, child 1 first).
func (c *Children) Wait() ([][]byte, error) {
	outs := make([][]byte, len(c.cmds))
	var errs []error
	for i, cmd := range c.cmds {
		if err := cmd.Wait(); err != nil {
			errs = append(errs, fmt.Errorf("child %d: %w", i+1, err))
			continue
		}
		outs[i] = c.outs[i].Bytes()
	}
	return outs, errors.Join(errs...)
}
