//go:build !linux

package localcluster

import "os/exec"

// Exited polls: only Linux has pidfds.
func Exited(pid int) (<-chan struct{}, error) { return pollExited(pid) }

// DieWithParent does nothing here: only Linux has a parent-death signal,
// so the trainers of a killed raftps train must be stopped by hand.
func DieWithParent(*exec.Cmd) {}
