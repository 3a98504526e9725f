package main

import (
	"strings"
	"testing"
	"time"

	"github.com/pspnode/pspnode/testnet/report"
)

// The progress line tells the run's speed in paper node-seconds per wall
// and per CPU second, and when it will end, from its second snapshot on.
func TestProgressRate(t *testing.T) {
	var r progressRate
	snap := func(elapsed, wall time.Duration) report.Snapshot {
		return report.Snapshot{Elapsed: elapsed, Wall: wall, Live: 100}
	}
	const scale = 0.5 // a second of the run's clock is 2 paper seconds
	if got := r.line(snap(time.Second, time.Second), time.Minute, scale, 10*time.Second); got != "" {
		t.Errorf("first snapshot: %q", got)
	}
	// 10 s of the clock in 20 s of wall and 40 s of CPU: 100 nodes × 20
	// paper seconds = 2000 node-seconds, 100 per wall second, 50 per CPU
	// second; 49 s of the clock left at 0.5× real time take 98 s.
	got := r.line(snap(11*time.Second, 21*time.Second), time.Minute, scale, 50*time.Second)
	for _, want := range []string{"100 paper node-s/s", "(50 per CPU-s)", "ends in ~1m38s"} {
		if !strings.Contains(got, want) {
			t.Errorf("line %q lacks %q", got, want)
		}
	}
	// A snapshot with no wall clock, or a run with no time scale, has no rate.
	if got := r.line(snap(12*time.Second, -1), time.Minute, scale, time.Minute); got != "" {
		t.Errorf("no wall clock: %q", got)
	}
	// The next barrier's run starts again from its own first snapshot.
	if got := r.line(snap(time.Second, time.Second), time.Minute, scale, 70*time.Second); got != "" {
		t.Errorf("next run's first snapshot: %q", got)
	}
}
