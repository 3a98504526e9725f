//go:build !linux

package main

import "syscall"

// childAttr: the comparison runs on Linux only (netns.CheckLinks says so).
func childAttr() *syscall.SysProcAttr { return nil }

// procCPU: not read off Linux.
func procCPU(int) float64 { return -1 }
