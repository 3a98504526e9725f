//go:build !linux

package trainer

import "errors"

// Shared memory is offered on Linux only; elsewhere tensors cross the
// socket in the messages.
const sharedMemorySupported = false

func defaultSharedDir() string { return "" }

type shmFile struct {
	path string
	mem  []byte
}

func createShared(string, int) (*shmFile, error) {
	return nil, errors.New("shared memory: not supported on this system")
}

func (s *shmFile) unlink()         {}
func (s *shmFile) close()          {}
func removeStaleShared(string) int { return 0 }

// memAvailable is not known here.
func memAvailable() uint64 { return 0 }
