//go:build linux

package trainer

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// A shared file: a file in /dev/shm (a tmpfs: memory, never disk) that
// the daemon and the trainer both map, so that a tensor crosses between
// them without being copied through the socket. The daemon creates it
// (mode 0600, so only the daemon's user can map it), the trainer maps it
// and says so (SharedMemoryReady), and the daemon then unlinks it: the
// memory lives while either side has it mapped and is freed when both are
// gone, whatever way they end. A daemon killed between creating and
// unlinking leaves the file; the next daemon to start removes the files of
// daemons that no longer run (their PID is in the name).

// sharedMemorySupported: Linux with a little-endian CPU (the regions are
// read in place as float32 little-endian).
var sharedMemorySupported = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

const shmPrefix = "pspnode-trainer-"

// defaultSharedDir is /dev/shm when the system has it, else the temporary
// directory.
func defaultSharedDir() string {
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		return "/dev/shm"
	}
	return os.TempDir()
}

type shmFile struct {
	path string
	mem  []byte
}

// createShared makes a shared file of size bytes in dir and maps it.
func createShared(dir string, size int) (*shmFile, error) {
	f, err := os.CreateTemp(dir, shmPrefix+strconv.Itoa(os.Getpid())+"-*")
	if err != nil {
		return nil, fmt.Errorf("shared memory: %w", err)
	}
	path := f.Name()
	fail := func(err error) (*shmFile, error) {
		f.Close()
		os.Remove(path)
		return nil, fmt.Errorf("shared memory %s: %w", path, err)
	}
	if err := f.Truncate(int64(size)); err != nil {
		return fail(err)
	}
	mem, err := syscall.Mmap(int(f.Fd()), 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		return fail(err)
	}
	f.Close() // the mapping keeps the memory
	return &shmFile{path: path, mem: mem}, nil
}

// unlink removes the file's name; the mappings stay.
func (s *shmFile) unlink() { _ = os.Remove(s.path) }

// close unmaps the file and removes its name.
func (s *shmFile) close() {
	s.unlink()
	if s.mem != nil {
		_ = syscall.Munmap(s.mem)
		s.mem = nil
	}
}

// removeStaleShared removes the shared files of daemons that no longer
// run, and returns how many it removed.
func removeStaleShared(dir string) int {
	names, _ := filepath.Glob(filepath.Join(dir, shmPrefix+"*"))
	removed := 0
	for _, name := range names {
		rest := strings.TrimPrefix(filepath.Base(name), shmPrefix)
		pid, err := strconv.Atoi(rest[:max(strings.IndexByte(rest, '-'), 0)])
		if err != nil || pid <= 0 || pid == os.Getpid() {
			continue
		}
		if err := syscall.Kill(pid, 0); err == syscall.ESRCH {
			if os.Remove(name) == nil {
				removed++
			}
		}
	}
	return removed
}

// memAvailable is the memory the system says is available for new
// allocations (MemAvailable in /proc/meminfo), 0 when it does not say.
func memAvailable() uint64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "MemAvailable:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				return 0
			}
			return kb << 10
		}
	}
	return 0
}
