package node

import (
	"math"
	"time"
)

// Barrier timing. Every interval on the barrier path follows two things the
// node measures itself: its mean compute time per step, c (an EWMA of the
// time the task takes, waits excluded), and its smoothed step-query round
// trip, r. So a job paces its checks the same way at 20-ms steps as at the
// paper's 2-s steps, and a testnet's figures do not depend on its time
// scale. The absolute values in Config are floors and caps, kept only where
// the network or the process needs them.
//
//	re-check interval p   for a sampled barrier (pBSP, pSSP, pDSSP),
//	                      c/N̂ but at least PollShare × c; for a global one
//	                      (BSP, SSP, DSSP, which progress notes wake),
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
//	                      r are known. A query that times out marks its peer
//	                      dead.
//	stuck window          psp.Screen: StuckIntervals × the node's own step
//	                      interval (waits included).
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
	sec := func(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
	share := cfg.GlobalPollShare
	if sampled {
		share = max(cfg.PollShare, 1/max(n, 1))
	}
	p := min(max(sec(share*c), cfg.PollMin, sec(2*r)), cfg.PollMax)
	tm := timing{recheck: p, first: min(max(p/4, cfg.PollMin), p), wake: p / 2, timeout: cfg.QueryTimeout}
	if c > 0 && r > 0 {
		tm.timeout = min(max(sec(4*c), sec(16*r), cfg.QueryTimeoutMin), cfg.QueryTimeout)
	}
	tm.hedge = min(max(sec(4*r), cfg.PollMin, p/4), tm.timeout/2)
	return tm
}

// timing is the node's barrier timing now.
func (n *Node) timing() timing {
	c := math.Float64frombits(n.compute.Load())
	sampled := n.cfg.Barrier.Probabilistic()
	pop := 0.0
	if sampled {
		pop = n.population()
	}
	return barrierTiming(n.cfg, sampled, c, n.rttEWMA(), pop)
}
