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
// Go 1.26's race detector crashes in most runs of bubbles as busy as a
// testnet's ("ThreadSanitizer: CHECK failed: tsan_rtl.cpp:346 ...
// kEpochLast", golang/go#78156, open): the runtime gives all the timers of
// a bubble one race-detector context, and a timer's channel send runs on
// the thread that reads the channel, so two threads can use that context at
// once. With one P only one thread runs Go code at a time and the crash has
// not been seen. The detector still checks every pair of accesses for the
// synchronization between them; one P only narrows the interleavings a
// test happens to run.
func Test(t *testing.T, f func(*testing.T)) {
	t.Helper()
	if raceEnabled {
		defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	}
	synctest.Test(t, f)
}
