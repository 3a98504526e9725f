package main

import (
	"os"
	"strconv"
	"strings"
	"testing"
)

// TestProcCPU reads this process's CPU from /proc after burning some: it
// is at least what the process measured itself, and a missing process
// reads -1.
func TestProcCPU(t *testing.T) {
	before := selfCPU()
	x := 0.0
	for i := range 20_000_000 {
		x += float64(i)
	}
	_ = x
	got := procCPU(os.Getpid())
	if got < 0 {
		t.Fatalf("procCPU(self) = %v", got)
	}
	// /proc counts each thread's time in clock ticks (10 ms) and sums
	// them: allow one tick below per thread (under the race detector a
	// dozen threads lagged it 12 ms behind).
	slack := 0.011 * float64(max(1, threads()))
	if after := selfCPU(); got < before-slack || got > after+0.011 {
		t.Errorf("procCPU(self) = %v, want within [%v, %v]", got, before, after)
	}
	if got := procCPU(1 << 30); got != -1 {
		t.Errorf("procCPU(no such process) = %v, want -1", got)
	}
}

// threads is this process's thread count (/proc/self/status), 0 if
// unknown.
func threads() int {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Threads:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n
		}
	}
	return 0
}
