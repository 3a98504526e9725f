package barrier

import (
	"math"
	"time"

	"github.com/pspnode/pspnode/psp"
)

// Barrier timing: the rules are psp.BarrierTiming's (re-check, wake gap,
// hedge delay and query timeout from the node's own compute time c, its
// step-query round trip r and its population estimate). Config holds their
// shares, floors and caps; the stuck window is psp.Screen's (StuckIntervals
// × the node's own step interval, waits included).

// Timing is psp.Timing in durations.
type Timing struct {
	Recheck time.Duration // p: the longest interval between two checks
	First   time.Duration // the first re-check of a wait
	Wake    time.Duration // the least time between checks when woken
	Hedge   time.Duration
	Timeout time.Duration // one step query
}

// TimingOf applies the rules to compute time c and round trip r, both
// in seconds (0 while unknown), and the population estimate n, for a
// sampled or a global barrier.
func TimingOf(cfg psp.CheckConfig, sampled bool, c, r, n float64) Timing {
	tm := psp.BarrierTiming(cfg.Timing, sampled, c, r, n)
	d := func(s float64) time.Duration { return time.Duration(math.Round(s * 1e9)) }
	return Timing{Recheck: d(tm.Recheck), First: d(tm.First), Wake: d(tm.Wake), Hedge: d(tm.Hedge), Timeout: d(tm.Timeout)}
}

// queryTimeout is the node's step query timeout now: for the step queries
// outside a barrier (a barrier takes its timing at its start). It depends
// on the node's compute time and round trip alone, not on the population
// (which costs a look at every peer's report: once per query was 7 % of a
// 200-node testnet's CPU).
func (b *Barrier) queryTimeout() time.Duration {
	c := math.Float64frombits(b.compute.Load())
	return TimingOf(b.cfg.Check, b.cfg.Check.Spec.Probabilistic(), c, b.m.RTTEWMA(), 0).Timeout
}
