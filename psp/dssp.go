package psp

import "math"

// Dynamic SSP.
//
// DSSP (Zhao et al., "Dynamic Stale Synchronous Parallel Distributed Training
// for Deep Learning", ICDCS 2019) lets the staleness vary within
// [S_L, S_U]. A worker within S_L steps of the slowest goes on. When the
// fastest worker gets more than S_L steps ahead, a synchronisation
// controller grants it r extra iterations, 0 <= r <= S_U-S_L, choosing the r
// that minimises its predicted waiting time.
//
// The prediction rule, shared by the server controller and the decentralised
// form (ChooseAllowance): each worker's recent time per iteration is learnt
// from the timestamps of its recent completions (an exponentially weighted
// moving average, weight rateAlpha on the newest interval). If the fast
// worker runs r more iterations it finishes them at T_r = now + r·I_fast.
// The slowest worker is predicted to complete its coming iterations at
// S_j = last_slow + j·I_slow, j = 1, 2, … The predicted wait after r extra
// iterations is w(r) = min{S_j - T_r : S_j >= T_r}: the time from the end of
// the granted run to the slowest worker's next completion, when the fast
// worker would be released. The controller picks the r with the least w(r),
// the smallest r on ties. Without timing data it grants nothing, and DSSP
// then behaves as SSP(S_L). The hard bound S_U is checked at every pass: a
// granted credit is not used while the gap to the slowest exceeds S_U.

// rateAlpha is the EWMA weight of the newest interval in a step-rate estimate.
const rateAlpha = 0.3

// ChooseAllowance returns the number of extra iterations r in [0, maxExtra]
// that minimises the predicted wait w(r) described above. fastInterval and
// slowInterval are seconds per iteration; slowLast is the time of the
// slowest worker's last completion. Unknown (non-positive or non-finite)
// intervals give 0.
func ChooseAllowance(now, fastInterval, slowLast, slowInterval float64, maxExtra int) int {
	if !(fastInterval > 0) || !(slowInterval > 0) || math.IsInf(fastInterval, 0) ||
		math.IsInf(slowInterval, 0) || math.IsNaN(now) || math.IsNaN(slowLast) || maxExtra <= 0 {
		return 0
	}
	best, bestWait := 0, math.Inf(1)
	for r := 0; r <= maxExtra; r++ {
		tr := now + float64(r)*fastInterval
		j := math.Max(1, math.Ceil((tr-slowLast)/slowInterval))
		w := slowLast + j*slowInterval - tr
		if w < bestWait-1e-12 {
			best, bestWait = r, w
		}
	}
	return best
}

// usable is the largest allowance that can be used in full from a gap of
// gap steps: the grant passes now and r-1 more times, and the gap may grow
// by one each time, so r <= S_U - gap + 1, and never more than S_U - S_L.
func usable(gap, sl, su int) int { return max(0, min(su-sl, su-gap+1)) }

// rate learns a worker's time per iteration from the times its step was
// seen to change.
type rate struct {
	valid    bool // step and since hold a first observation
	step     Step
	since    float64 // when step was first seen (≈ its completion time)
	interval float64 // EWMA of seconds per step; 0 until known
	seen     float64 // last time observed, for eviction
}

func (r *rate) observe(step Step, now float64) {
	r.seen = now
	if !r.valid {
		r.valid, r.step, r.since = true, step, now
		return
	}
	if step <= r.step {
		return
	}
	{
		sample := (now - r.since) / float64(step-r.step)
		if sample > 0 && !math.IsInf(sample, 0) {
			if r.interval == 0 {
				r.interval = sample
			} else {
				r.interval = rateAlpha*sample + (1-rateAlpha)*r.interval
			}
		}
	}
	r.step, r.since = step, now
}

// DSSPController is the server-based DSSP controller of the reference: one
// controller sees every worker's pushes. pspnode has no server; this exists
// as the simulator's baseline (an oracle of global state, labelled as such).
// Workers are indexed 0..n-1; Join adds more. Not safe for concurrent use.
type DSSPController struct {
	sl, su  int
	steps   []Step
	credits []int
	timing  []rate
	live    []bool
}

// NewDSSPController returns a controller for n workers at step 0 with
// staleness range [sl, su].
func NewDSSPController(n, sl, su int) *DSSPController {
	c := &DSSPController{sl: sl, su: max(sl, su)}
	for range n {
		c.Join(0, 0)
	}
	return c
}

// Join adds a worker at the given step and returns its index.
func (c *DSSPController) Join(step Step, now float64) int {
	c.steps = append(c.steps, step)
	c.credits = append(c.credits, 0)
	c.timing = append(c.timing, rate{valid: true, step: step, since: now})
	c.live = append(c.live, true)
	return len(c.steps) - 1
}

// Leave removes a worker from the controller's view (a graceful leave the
// server is told about). A crashed worker that never says so stays in view
// and, as in SSP, holds the others back.
func (c *DSSPController) Leave(w int) { c.live[w] = false }

func (c *DSSPController) extremes() (slow, fast int) {
	slow, fast = -1, -1
	for i, s := range c.steps {
		if !c.live[i] {
			continue
		}
		if slow < 0 || s < c.steps[slow] {
			slow = i
		}
		if fast < 0 || s > c.steps[fast] {
			fast = i
		}
	}
	return slow, fast
}

// Push records that worker w completed an iteration at time now and decides
// whether it may start the next one. A worker told to wait is re-checked
// with Retry.
func (c *DSSPController) Push(w int, now float64) Decision {
	c.steps[w]++
	c.timing[w].observe(c.steps[w], now)
	slow, fast := c.extremes()
	gap := int(c.steps[w] - c.steps[slow])
	if c.credits[w] > 0 && gap <= c.su {
		c.credits[w]--
		return Decision{Pass: true, Staleness: gap}
	}
	c.credits[w] = 0
	if gap <= c.sl {
		return Decision{Pass: true, Staleness: c.sl}
	}
	if c.steps[w] >= c.steps[fast] && gap <= c.su {
		r := ChooseAllowance(now, c.timing[w].interval, c.timing[slow].since, c.timing[slow].interval, usable(gap, c.sl, c.su))
		if r > 0 {
			c.credits[w] = r - 1 // this pass uses the first extra iteration
			return Decision{Pass: true, Staleness: gap, Granted: r}
		}
	}
	return Decision{Pass: false, Staleness: c.sl, Lagging: 1}
}

// Retry re-checks a waiting worker: it may go on once it is within S_L of
// the slowest live worker.
func (c *DSSPController) Retry(w int) Decision {
	slow, _ := c.extremes()
	gap := int(c.steps[w] - c.steps[slow])
	if gap <= c.sl {
		return Decision{Pass: true, Staleness: c.sl}
	}
	return Decision{Pass: false, Staleness: c.sl, Lagging: 1}
}

// Step returns worker w's step as the controller knows it.
func (c *DSSPController) Step(w int) Step { return c.steps[w] }

// maxTracked bounds the peers a PDSSP remembers; the least recently seen are
// forgotten first.
const maxTracked = 4096

// PDSSPDecider is the decentralised DSSP: each node is its own controller. It
// learns the step rates of the peers it samples from successive replies (or
// takes the interval a peer reports), learns its own compute time per
// iteration, and, when it is the fastest in its sample and more than S_L
// steps ahead of the slowest sampled peer, grants itself the allowance
// ChooseAllowance predicts to minimise its wait, never beyond S_U. One PDSSPDecider
// per node; not safe for concurrent use.
type PDSSPDecider struct {
	sl, su int
	peers  map[string]*rate

	self        Step
	completedAt float64 // when self was first reported (iteration end)
	startedAt   float64 // when the check for the previous step passed (iteration start)
	started     bool    // startedAt is set
	compute     float64 // EWMA seconds of compute per iteration
	credits     int
	creditStep  Step
}

// NewPDSSP returns a decentralised DSSP decider with staleness range [sl, su].
func NewPDSSP(sl, su int) *PDSSPDecider {
	return &PDSSPDecider{sl: sl, su: max(sl, su), peers: make(map[string]*rate), self: -1, creditStep: -1}
}

// Decide implements Decider.
func (d *PDSSPDecider) Decide(self Step, now float64, observed []Observation) Decision {
	if self != d.self {
		if d.self >= 0 && self == d.self+1 && d.started {
			if iv := now - d.startedAt; iv > 0 {
				if d.compute == 0 {
					d.compute = iv
				} else {
					d.compute = rateAlpha*iv + (1-rateAlpha)*d.compute
				}
			}
		}
		d.self, d.completedAt = self, now
	}
	slowest, fastest := -1, Step(math.MinInt64)
	// The slowest peer's rate is kept here, not looked up again later: with
	// more than maxTracked observations, track may evict it within this loop.
	var slowRate *rate
	for i, o := range observed {
		r := d.track(o.Peer, now)
		r.observe(o.Step, now)
		if o.Interval > 0 && !math.IsInf(o.Interval, 0) {
			r.interval = o.Interval
		}
		if slowest < 0 || o.Step < observed[slowest].Step {
			slowest, slowRate = i, r
		}
		fastest = max(fastest, o.Step)
	}
	pass := func(dec Decision) Decision {
		dec.Pass = true
		d.startedAt, d.started = now, true
		return dec
	}
	if slowest < 0 {
		return pass(Decision{Staleness: d.sl})
	}
	slow := observed[slowest]
	gap := int(min(self-slow.Step, math.MaxInt32))
	if gap <= d.sl {
		return pass(Decision{Staleness: d.sl})
	}
	if gap > d.su {
		return Decision{Staleness: d.sl, Lagging: Lagging(self, d.sl, steps(observed))}
	}
	if d.credits > 0 && d.creditStep != self {
		d.credits--
		d.creditStep = self
		return pass(Decision{Staleness: gap})
	}
	if self >= fastest {
		r := ChooseAllowance(now, d.compute, slowRate.since, slowRate.interval, usable(gap, d.sl, d.su))
		if r > 0 {
			d.credits, d.creditStep = r-1, self
			return pass(Decision{Staleness: gap, Granted: r})
		}
	}
	return Decision{Staleness: d.sl, Lagging: Lagging(self, d.sl, steps(observed))}
}

func (d *PDSSPDecider) track(p string, now float64) *rate {
	if r, ok := d.peers[p]; ok {
		return r
	}
	if len(d.peers) >= maxTracked {
		oldest, t := "", math.Inf(1)
		for k, r := range d.peers {
			if r.seen < t {
				oldest, t = k, r.seen
			}
		}
		delete(d.peers, oldest)
	}
	r := &rate{}
	d.peers[p] = r
	return r
}

func steps(obs []Observation) []Step {
	out := make([]Step, len(obs))
	for i, o := range obs {
		out[i] = o.Step
	}
	return out
}
