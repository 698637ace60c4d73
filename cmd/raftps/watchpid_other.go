//go:build !linux

package main

import "os/exec"

func exited(pid int) (<-chan struct{}, error) { return pollExited(pid) }

// dieWithParent does nothing here: only Linux has a parent-death signal,
// so the trainers of a killed raftps train must be stopped by hand.
func dieWithParent(*exec.Cmd) {}
