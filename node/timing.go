package node

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

// checkConfig is the barrier policy of cfg for psp.Checker.
func checkConfig(cfg Config) psp.CheckConfig {
	return psp.CheckConfig{
		Spec:          cfg.Barrier,
		Replacements:  cfg.Check.Replacements,
		GlobalQueries: cfg.Check.GlobalQueries,
		Timing: psp.TimingConfig{
			PollShare: cfg.Check.PollShare, GlobalPollShare: cfg.Check.GlobalPollShare,
			PollMin: cfg.Check.PollMin.Seconds(), PollMax: cfg.Check.PollMax.Seconds(),
			QueryTimeoutMin: cfg.Check.QueryTimeoutMin.Seconds(), QueryTimeout: cfg.Check.QueryTimeout.Seconds(),
		},
		Pace: cfg.Check.Pace,
	}
}

// timing is psp.Timing in durations.
type timing struct {
	recheck time.Duration // p: the longest interval between two checks
	first   time.Duration // the first re-check of a wait
	wake    time.Duration // the least time between checks when woken
	hedge   time.Duration
	timeout time.Duration // one step query
}

// barrierTiming applies the rules to compute time c and round trip r, both
// in seconds (0 while unknown), and the population estimate n, for a
// sampled or a global barrier.
func barrierTiming(cfg Config, sampled bool, c, r, n float64) timing {
	tm := psp.BarrierTiming(checkConfig(cfg).Timing, sampled, c, r, n)
	d := func(s float64) time.Duration { return time.Duration(math.Round(s * 1e9)) }
	return timing{recheck: d(tm.Recheck), first: d(tm.First), wake: d(tm.Wake), hedge: d(tm.Hedge), timeout: d(tm.Timeout)}
}

// queryTimeout is the node's step query timeout now: for the step queries
// outside a barrier (a barrier takes its timing at its start). It depends
// on the node's compute time and round trip alone, not on the population
// (which costs a look at every peer's report: once per query was 7 % of a
// 200-node testnet's CPU).
func (b *barrier) queryTimeout() time.Duration {
	c := math.Float64frombits(b.compute.Load())
	return barrierTiming(*b.cfg, b.cfg.Barrier.Probabilistic(), c, b.m.RTTEWMA(), 0).timeout
}
