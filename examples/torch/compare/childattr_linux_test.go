package main

import (
	"os"
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
	// /proc counts in clock ticks (10 ms): allow one tick below.
	if after := selfCPU(); got < before-0.011 || got > after+0.011 {
		t.Errorf("procCPU(self) = %v, want within [%v, %v]", got, before, after)
	}
	if got := procCPU(1 << 30); got != -1 {
		t.Errorf("procCPU(no such process) = %v, want -1", got)
	}
}
