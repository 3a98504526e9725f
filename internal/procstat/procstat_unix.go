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

// StartTime is when this process started, to 10 ms (Linux: its start
// in /proc/self/stat and the time since boot in /proc/uptime, both at the
// kernel's 100 ticks a second); the zero time where /proc does not tell.
func StartTime() time.Time {
	now := time.Now()
	stat, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		return time.Time{}
	}
	up, err := os.ReadFile("/proc/uptime")
	if err != nil {
		return time.Time{}
	}
	// The command name, in parentheses, may hold spaces: the fields
	// counted follow its closing parenthesis (field 2); the start time is
	// field 22.
	i := strings.LastIndexByte(string(stat), ')')
	if i < 0 {
		return time.Time{}
	}
	f := strings.Fields(string(stat[i+1:]))
	u := strings.Fields(string(up))
	if len(f) < 20 || len(u) < 1 {
		return time.Time{}
	}
	ticks, err1 := strconv.ParseInt(f[19], 10, 64)
	uptime, err2 := strconv.ParseFloat(u[0], 64)
	if err1 != nil || err2 != nil {
		return time.Time{}
	}
	age := time.Duration((uptime - float64(ticks)/clockTicks) * float64(time.Second))
	return now.Add(-max(age, 0))
}

// clockTicks is the kernel's USER_HZ: 100 on every Linux architecture Go
// runs on.
const clockTicks = 100
