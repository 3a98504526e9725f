//go:build !linux

package testnet

import "syscall"

// childAttr: the netns transport runs on Linux only (netns.Check says so).
func childAttr() *syscall.SysProcAttr { return nil }

// startSignal is unused off Linux.
const startSignal = syscall.Signal(0)
