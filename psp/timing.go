package psp

// Barrier timing. Every interval on the barrier path follows two things the
// node measures itself: its mean compute time per step, c (an EWMA of the
// time the task takes, waits excluded), and its smoothed step-query round
// trip, r. So a job paces its checks the same way at 20-ms steps as at the
// paper's 2-s steps, and a testnet's figures do not depend on its time
// scale. The absolute values in TimingConfig are floors and caps, kept only
// where the network or the process needs them.
//
//	re-check interval p   for a sampled barrier (pBSP, pSSP, pDSSP),
//	                      c/N̂ but at least PollShare × c; for a global one
//	                      (BSP, SSP, DSSP, which progress reports wake),
//	                      GlobalPollShare × c; at least max(PollMin, 2r),
//	                      at most PollMax. A wait re-checks first after
//	                      p/4, then doubles the interval up to p.
//	wake gap              p/2: the least time between two checks when
//	                      peers' progress reports wake the node (a burst of
//	                      reports costs one check).
//	hedge delay           4r, at least max(PollMin, p/4), at most half the
//	                      query timeout: a sampled peer that has not
//	                      answered by then gets a fresh draw asked beside it.
//	query timeout         max(4c, 16r, QueryTimeoutMin), at most
//	                      QueryTimeout; QueryTimeout itself until both c and
//	                      r are known. A query that times out fails.
//
// Why c/N̂: the paper's simulator re-checks every waiting node, with a
// fresh sample, at every step completion in the population, and N nodes
// that each take c per step complete one every c/N on average. A node that
// re-checked more often would re-draw its sample while nothing changed,
// passing more easily than the barrier's semantics allow (at N = 4 a
// pSSP(2, 1) spread grows past the simulator's); one that re-checked less
// often would wait longer than the semantics require. PollShare bounds the
// cost in large jobs: a waiting node sends at most β/PollShare queries per
// step time.
//
// Where the floors come from: a check costs at least a round trip, so
// re-checking faster than 2r only queues queries; PollMin keeps a node
// whose compute and round trips are both near zero (a virtual clock, a
// loopback testnet) from spinning; QueryTimeoutMin keeps a live peer from
// being declared dead by a scheduling or garbage-collection pause of its
// process (tens of milliseconds). The caps: PollMax keeps a node with very
// long steps re-checking at least that often, and QueryTimeout bounds how
// long a dead peer can hold a check.

// TimingConfig holds the timing rules' shares, floors and caps (seconds).
type TimingConfig struct {
	PollShare, GlobalPollShare    float64
	PollMin, PollMax              float64
	QueryTimeoutMin, QueryTimeout float64
}

// DefaultTimingConfig returns the node's defaults (node.DefaultConfig):
// PollShare 1/64, GlobalPollShare 1/4, PollMin 100 µs, PollMax 500 ms,
// QueryTimeoutMin 50 ms, QueryTimeout 1 s.
func DefaultTimingConfig() TimingConfig {
	return TimingConfig{PollShare: 1.0 / 64, GlobalPollShare: 1.0 / 4, PollMin: 100e-6, PollMax: 0.5, QueryTimeoutMin: 0.05, QueryTimeout: 1}
}

// Timing is a barrier's intervals, in seconds.
type Timing struct {
	Recheck float64 // p: the longest interval between two checks
	First   float64 // the first re-check of a wait
	Wake    float64 // the least time between checks when woken
	Hedge   float64
	Timeout float64 // one step query
}

// BarrierTiming applies the rules to compute time c and round trip r, both
// in seconds (0 while unknown), and the population estimate n, for a
// sampled or a global barrier.
func BarrierTiming(cfg TimingConfig, sampled bool, c, r, n float64) Timing {
	share := cfg.GlobalPollShare
	if sampled {
		share = max(cfg.PollShare, 1/max(n, 1))
	}
	p := min(max(share*c, cfg.PollMin, 2*r), cfg.PollMax)
	tm := Timing{Recheck: p, First: min(max(p/4, cfg.PollMin), p), Wake: p / 2, Timeout: cfg.QueryTimeout}
	if c > 0 && r > 0 {
		tm.Timeout = min(max(4*c, 16*r, cfg.QueryTimeoutMin), cfg.QueryTimeout)
	}
	tm.Hedge = min(max(4*r, cfg.PollMin, p/4), tm.Timeout/2)
	return tm
}
