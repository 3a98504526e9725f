//go:build !linux

package netns

import "syscall"

// childAttr: the netns transport runs on Linux only (internal/netns.Check says so).
func childAttr() *syscall.SysProcAttr { return nil }

// startSignal is unused off Linux.
const startSignal = syscall.Signal(0)
