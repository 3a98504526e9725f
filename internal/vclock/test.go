package vclock

import (
	"runtime"
	"testing"
	"testing/synctest"
)

// Test runs f in a synctest bubble, as synctest.Test does, for tests of
// code that runs on the virtual clock.
//
// Under the race detector the bubble runs with GOMAXPROCS 1. With more,
// Go 1.26's race detector crashes in most runs of busy bubbles
// ("ThreadSanitizer: CHECK failed: tsan_rtl.cpp:346 ... kEpochLast", or a
// crash inside tsan; golang/go#78156, open). The runtime runs a bubble's
// timers under one race context shared by the whole bubble, and a timer
// that is already due when a goroutine resets or receives from it (the
// in-memory transport's zero-latency links do this for every message:
// Reset(0), then a receive) runs at once on that goroutine's thread. Two
// threads then use one race context at the same time and corrupt it. Timer
// code runs holding a P, so with one P this cannot happen. The detector
// still reports every pair of accesses without a happens-before edge
// between them; one P only narrows the interleavings a test happens to
// run.
func Test(t *testing.T, f func(*testing.T)) {
	t.Helper()
	if raceEnabled {
		defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	}
	synctest.Test(t, f)
}
