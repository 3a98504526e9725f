package testnet

import (
	"os"
	"strconv"
	"strings"
)

// availableMemory returns the bytes this process can still use: the
// kernel's MemAvailable, or the cgroup's limit less its usage if smaller;
// 0 if neither can be read.
var availableMemory = machineMemory

// machineMemory is availableMemory on this machine.
func machineMemory() float64 {
	avail := meminfo("MemAvailable:")
	if lim, ok := readNumber("/sys/fs/cgroup/memory.max"); ok {
		used, _ := readNumber("/sys/fs/cgroup/memory.current")
		if left := lim - used; avail == 0 || left < avail {
			avail = left
		}
	}
	return avail
}

// meminfo reads one field of /proc/meminfo, in bytes (0 if absent).
func meminfo(field string) float64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(line, field); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			if err == nil {
				return 1024 * kb
			}
		}
	}
	return 0
}

// readNumber reads a file holding one number ("max" is not one).
func readNumber(path string) (float64, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	v, err := strconv.ParseFloat(strings.TrimSpace(string(b)), 64)
	return v, err == nil
}
