//go:build unix

package main

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// lockIdentity takes an exclusive lock on the identity file for as long as
// the process runs (the kernel drops it when the process ends, however it
// ends, so no lock outlives its node). Two nodes with one identity would
// be one peer to the job, each dropping the other's connections: the
// second gets an error that says so. The returned func releases the lock.
func lockIdentity(path string) (func(), error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("identity: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("--identity %s is in use by another pspnode run on this machine: two nodes with one identity are one peer to the job, and each would drop the other's connections; give each node its own identity file", path)
		}
		return nil, fmt.Errorf("identity: lock %s: %w", path, err)
	}
	return func() { f.Close() }, nil
}
