//go:build !linux

package main

import "syscall"

// childAttr: the comparison runs on Linux only (netns.CheckLinks says so).
func childAttr() *syscall.SysProcAttr { return nil }
