//go:build !linux

package main

func exited(pid int) (<-chan struct{}, error) { return pollExited(pid) }
