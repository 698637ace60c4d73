package localcluster

import (
	"errors"
	"fmt"
	"os/exec"
	"syscall"

	"golang.org/x/sys/unix"
)

// Exited returns a channel closed once process pid has exited. A pidfd
// names the process itself, not its number, so a number reused by a later
// process cannot keep the watch alive; it becomes readable at exit, before
// the parent reaps it. Kernels before 5.3 have no pidfd: polling then.
func Exited(pid int) (<-chan struct{}, error) {
	fd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return nil, fmt.Errorf("no process %d", pid)
	}
	if err != nil {
		return pollExited(pid)
	}
	done := make(chan struct{})
	go func() {
		defer unix.Close(fd)
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		for {
			_, err := unix.Poll(fds, -1)
			if err == nil {
				close(done)
				return
			}
			if !errors.Is(err, unix.EINTR) {
				// Not a reason to stop the node: watch the slow way.
				if polled, err := pollExited(pid); err == nil {
					<-polled
				}
				close(done)
				return
			}
		}
	}()
	return done, nil
}

// DieWithParent makes cmd's process get SIGTERM when this process dies, so
// a trainer started by raftps train --trainers N does not train on alone
// (until its client gives up) after its parent was killed. The kernel sends
// it when the thread that started the child exits; Go ends a thread only
// when a goroutine locked to it returns, which raftps never does.
func DieWithParent(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGTERM
}
