package main

import (
	"os"
	"strconv"
	"strings"
	"syscall"
)

// childAttr makes a run's process die with the harness (even when it is
// killed) and keeps it out of the terminal's process group: a SIGINT there
// is the harness's to handle, which stops the processes in order.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// procCPU is a running process's user and system CPU seconds (Linux
// /proc/PID/stat); -1 when it cannot be read.
func procCPU(pid int) float64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return -1
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return -1
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return -1
	}
	ut, err1 := strconv.ParseFloat(f[11], 64)
	st, err2 := strconv.ParseFloat(f[12], 64)
	if err1 != nil || err2 != nil {
		return -1
	}
	return (ut + st) / clockTicks
}

// clockTicks is the kernel's USER_HZ, the unit of /proc/PID/stat's times
// (100 on every Linux architecture Go supports).
const clockTicks = 100
