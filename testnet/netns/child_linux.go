package netns

import "syscall"

// childAttr puts a node process in a process group of its own, so that a
// terminal's SIGINT reaches the parent alone (which stops the nodes in
// order), and has the kernel kill it if the parent dies.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// startSignal starts a node run with --start-on-signal.
const startSignal = syscall.SIGUSR1
