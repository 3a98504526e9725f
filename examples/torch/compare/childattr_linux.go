package main

import "syscall"

// childAttr makes a run's process die with the harness (even when it is
// killed) and keeps it out of the terminal's process group: a SIGINT there
// is the harness's to handle, which stops the processes in order.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
