//go:build unix

package procstat

import (
	"bufio"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// CPUTime is the process's user plus system CPU time.
func CPUTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// PeakRSS is the process's peak resident set in bytes (Linux: VmHWM; 0
// where /proc is missing).
func PeakRSS() int64 { return statusKB("VmHWM:") }

// statusKB reads a "kB" field of /proc/self/status in bytes (0 if absent).
func statusKB(field string) int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), field); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err == nil {
				return kb * 1024
			}
		}
	}
	return 0
}

// ResetPeakRSS starts PeakRSS over from the current resident set (Linux:
// clear_refs), so that one of several runs in a process reports its own
// peak; it reports whether it could.
func ResetPeakRSS() bool {
	return os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) == nil
}

// RSS is the process's current resident set in bytes (Linux: VmRSS; 0
// where /proc is missing).
func RSS() int64 { return statusKB("VmRSS:") }
