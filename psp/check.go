package psp

import "slices"

// Checker runs a node's barrier for one step as a pure machine, in the
// manner of etcd's raft.RawNode: it does no I/O, keeps no clock and starts
// no goroutine. The caller (the node, or the simulator) feeds it events
// (Start, Drawn, Known, Answer, Failed, Tick, Woken, Recheck), each with
// the time on the caller's clock in seconds, and after each carries out
// what Ready says: draw peers from its sampler, ask peers for their steps,
// call Tick at the wake time. So the node and the simulator run one
// policy:
//
//   - A check of a sampled barrier (pBSP, pSSP, pDSSP) asks β drawn peers.
//     It hedges: a peer that fails, or whose answer does not count, is
//     replaced by a fresh draw at once, and a peer that has not answered
//     after the hedge delay gets a fresh draw asked beside it (each query
//     once); at most Replacements × β fresh draws per check. It ends with
//     the first β answers that count. Under pBSP and pSSP a drawn peer
//     the caller knows at or above the check's threshold (DrawnKnown)
//     counts without asking, as under BSP and SSP: its answer could not
//     be behind. And a drawn peer known to be below the threshold until
//     it says otherwise (Known.Below: it promised a progress notice)
//     fails the check at once, as its answer would: nothing is asked.
//     With the pace rule on, a drawn peer known below the threshold that
//     the rule, on a fresh record, finds slow or far behind is excused
//     without asking too (Pace.JudgeUnasked): its answer would be
//     excused, and a round trip on a long link costs the node more than
//     the step it would wait for.
//   - A check of a global barrier (BSP, SSP, DSSP) asks every known peer
//     that may lag, at most GlobalQueries at a time, those never seen
//     first, then the lowest known steps. Under BSP and SSP a peer known
//     to be at or above the check's threshold is counted without asking
//     (steps only grow), and one known below it until it says otherwise
//     (Known.Below) fails the check at once, unasked.
//   - A static barrier's check (all but DSSP and pDSSP) ends at the first
//     answer behind its threshold: one such answer fails it whatever the
//     others say (Behind).
//   - Under pBSP and pSSP with the pace rule on (CheckConfig.Pace), a
//     peer behind the threshold that is slow or far behind (Pace.Judge)
//     is excused: it neither ends the check nor fails it.
//   - A check that hears from no peer is isolated and fails: see Isolated.
//   - A node that must wait checks again after the first re-check
//     interval, then doubling up to the re-check interval; a progress
//     report (Woken) brings the next check forward to the wake gap after
//     the last check.
//
// The intervals follow the node's own compute time, round trip and
// population estimate (BarrierTiming), taken once per barrier at Start.
//
// A Checker is not safe for concurrent use. The slices Ready returns are
// valid until the next call.
type Checker struct {
	cfg     CheckConfig
	decider Decider
	pace    *Pace // the pace rule (pBSP, pSSP with CheckConfig.Pace on); nil: off

	self    Step
	beta    int // the sample size of this barrier (Spec.BetaFor the population at Start)
	timing  Timing
	phase   phase
	checks  int     // checks so far in this barrier
	backoff float64 // the current wait between checks
	checked float64 // when the last check ended
	wakeAt  float64 // waiting: when the next check starts
	wokenUp bool    // a progress report came during a check

	// The check in progress.
	draw        int // drawing: how many peers to draw
	want        int
	budget      int
	asked       []string
	out         []pending // queries in flight
	spares      []string
	replacing   int // replacements owed to a pending draw
	obs         []Observation
	exc         []Excuse      // the pace rule's verdict on each of obs
	held        []Observation // obs less the excused, for the decider
	slow, far   int           // peers behind the threshold the check excused
	kexc        []Excuse      // scratch: the verdicts on a draw's peers known below the threshold
	answered    int
	hedged      int
	cached      int
	knownBehind bool     // the check failed on a peer known below its threshold
	counted     []string // a sampled check's peers counted without asking
	cands       []Known  // a global check's peers to ask, in order
	next        int      // the next of cands to ask
	ask         []string
	ready       CheckOut // what Ready returns next
}

type phase uint8

const (
	idle    phase = iota // no barrier in progress
	drawing              // waiting for Drawn or Known
	asking               // queries in flight
	waiting              // a check failed: the next starts at wakeAt
	passed               // the barrier passed
)

type pending struct {
	peer   string
	at     float64 // when it was asked
	hedged bool    // a fresh draw was asked beside it, or it is a global query
}

// NewChecker returns a Checker for cfg deciding with d (NewDecider(cfg.Spec)
// if nil). A stateful Decider (DSSP, pDSSP) belongs to one node.
func NewChecker(cfg CheckConfig, d Decider) *Checker {
	if d == nil {
		d = NewDecider(cfg.Spec)
	}
	c := &Checker{cfg: cfg, decider: d}
	if cfg.Pace.On() && cfg.Spec.Kind.info().Pace {
		c.pace = NewPace(cfg.Pace)
	}
	return c
}

// Pace is the pace the Checker learnt of its peers (nil when the rule is
// off). It changes only within the Checker's calls.
func (c *Checker) Pace() *Pace { return c.pace }

// Timing is the barrier's timing, as set at Start.
func (c *Checker) Timing() Timing { return c.timing }

// Start begins the barrier for a node that has completed in.Self steps,
// and its first check.
func (c *Checker) Start(in CheckStart) { c.put(c.start(in)) }

// Recheck starts the next check now, whatever the wait: for a caller that
// re-checks on its own events (the simulator's completions). It does
// nothing unless the node waits.
func (c *Checker) Recheck(now float64) { c.put(c.recheck(now)) }

// Drawn takes the peers drawn for a sampled check (Ready's Draw).
// heardLately says whether the node has heard lately from a peer that has
// not left; it matters only when there is no peer to ask (see Isolated).
func (c *Checker) Drawn(peers []string, heardLately bool, now float64) {
	c.put(c.drawn(peers, nil, heardLately, now))
}

// DrawnKnown is Drawn with what the caller knows of each drawn peer's
// step without asking (known[i] is peers[i]'s; Peer is not read; a known
// of another length than peers is ignored, as nothing known). Under a
// static sampled barrier (pBSP, pSSP) a peer of the check's sample known
// at or above its threshold is counted without asking: steps only grow,
// so its answer could not be behind. A peer of the sample known to be
// below the threshold (Below at or under it) fails the check at once,
// unasked, as its answer would have: the first such peer is the check's
// one observation, at its known Step. Replacement draws are always
// asked. With the pace rule on, a peer of the sample known behind
// without a promise is excused without asking when the rule finds it slow
// or far behind on a fresh record (Pace.JudgeUnasked); otherwise it is
// asked. The caller should know steps only from answers it accepted
// (those its screen passed, say), since they count as answers do.
func (c *Checker) DrawnKnown(peers []string, known []Known, heardLately bool, now float64) {
	if len(known) != len(peers) {
		known = nil
	}
	c.put(c.drawn(peers, known, heardLately, now))
}

// Known takes a global check's peers (Ready's Known): every known peer,
// with its known step. Under BSP and SSP a peer known below the check's
// threshold (Below at or under it) fails the check at once, unasked, as
// under DrawnKnown. heardLately is as for Drawn.
func (c *Checker) Known(peers []Known, heardLately bool, now float64) {
	c.put(c.known(peers, heardLately, now))
}

// Answer takes a peer's answer to a query of the check in progress.
// counts says whether it counts: false for a peer that said it leaves,
// or whose report the caller refuses (another lineage of the job, or
// psp.Screen). A peer that answered at all shows the node is not
// isolated. An answer to a query of a check that has ended is ignored.
func (c *Checker) Answer(peer string, o Observation, counts bool, now float64) {
	c.put(c.answer(peer, o, counts, now))
}

// Failed takes a query that failed or timed out. (The caller marks the
// peer dead: that is its sampler's business.)
func (c *Checker) Failed(peer string, now float64) { c.put(c.failed(peer, now)) }

// Tick takes the time passing: due hedges, or the next check.
func (c *Checker) Tick(now float64) { c.put(c.tick(now)) }

// Woken takes a progress report: a peer at or behind the node advanced.
// The next check comes no sooner than the wake gap after the last, so a
// burst of reports costs one check, and no later than the wait would have
// brought it. A report during a check applies once it ends.
func (c *Checker) Woken(now float64) { c.put(c.woken(now)) }

// Ready returns what the caller must do now, and what a check that ended
// decided, and clears it (but for Wake, which stands until an input
// changes it). Its Ask slice is valid until the next call.
func (c *Checker) Ready() CheckOut {
	r := c.ready
	c.ready = CheckOut{Ask: r.Ask[:0], Wake: r.Wake}
	return r
}

// put adds an input's output to what Ready returns: queries to make
// accumulate; a check that ended drops those of its own not yet made.
func (c *Checker) put(o CheckOut) {
	r := &c.ready
	if o.Done {
		r.Ask = r.Ask[:0]
		r.Done, r.Pass, r.Decision, r.Isolated, r.Stats = true, o.Pass, o.Decision, o.Isolated, o.Stats
	}
	r.Ask = append(r.Ask, o.Ask...)
	r.Draw, r.Known, r.Wake = o.Draw, o.Known, o.Wake
}

// Observations are what the last check that ended observed (valid until
// the next call).
func (c *Checker) Observations() []Observation { return c.obs }

// start begins the barrier for a node that has completed in.Self steps,
// and its first check.
func (c *Checker) start(in CheckStart) CheckOut {
	sp := c.cfg.Spec
	c.self = in.Self
	c.timing = BarrierTiming(c.cfg.Timing, sp.Probabilistic(), in.Compute, in.RTT, in.Population)
	c.beta = sp.BetaFor(in.Population)
	if c.pace != nil {
		c.pace.SetCompute(in.Compute, in.Interval)
	}
	c.checks, c.backoff, c.wokenUp = 0, 0, false
	c.ready = CheckOut{Ask: c.ready.Ask[:0]}
	return c.begin(in.Now)
}

// recheck is Recheck.
func (c *Checker) recheck(now float64) CheckOut {
	if c.phase != waiting {
		return c.current(now)
	}
	return c.begin(now)
}

// begin starts a check.
func (c *Checker) begin(now float64) CheckOut {
	sp := c.cfg.Spec
	c.asked, c.out, c.spares, c.obs, c.cands, c.ask = c.asked[:0], c.out[:0], c.spares[:0], c.obs[:0], c.cands[:0], c.ask[:0]
	c.counted, c.exc, c.slow, c.far = c.counted[:0], c.exc[:0], 0, 0
	c.replacing, c.answered, c.hedged, c.cached, c.next, c.want, c.budget = 0, 0, 0, 0, 0, 0, 0
	c.knownBehind = false
	switch {
	case sp.Scope() == NoCheck:
		return c.decide(now, false, false)
	case sp.Global():
		c.phase = drawing
		return c.current(now)
	case c.beta <= 0:
		return c.decide(now, false, false)
	}
	c.phase, c.draw = drawing, c.beta
	return c.current(now)
}

// drawn is Drawn and DrawnKnown (known nil: nothing known).
func (c *Checker) drawn(peers []string, known []Known, heardLately bool, now float64) CheckOut {
	if c.phase != drawing || c.cfg.Spec.Global() {
		return c.current(now)
	}
	c.phase = asking
	if c.want == 0 && len(c.asked) == 0 && len(c.counted) == 0 { // the check's sample
		sp := c.cfg.Spec
		threshold := c.self - Step(sp.BaseStaleness())
		// The pace rule's verdicts on the peers known below the
		// threshold (Holds for the others).
		c.kexc = c.kexc[:0]
		for range peers {
			c.kexc = append(c.kexc, Holds)
		}
		if known != nil && !sp.Dynamic() {
			for i, k := range known {
				if c.inSample(peers[i]) {
					continue
				}
				if k.Below <= 0 || k.Below > threshold {
					// No promise: a peer seen behind is asked, unless
					// the pace rule knows it, freshly, slow or far.
					if c.pace != nil && k.Seen && k.Step < threshold {
						c.kexc[i] = c.pace.JudgeUnasked(peers[i], k.Step, threshold, now)
					}
					continue
				}
				k.Peer = peers[i]
				if o := knownBehind(k); c.pace != nil {
					if k.Seen {
						c.pace.Observe(k.Peer, k.Step, now)
					}
					if e := c.pace.Judge(k.Peer, o.Step, threshold, now); e != Holds {
						c.kexc[i] = e
						continue
					}
				}
				c.failKnownBehind(k)
				return c.decide(now, heardLately, true)
			}
		}
		for i, p := range peers {
			switch {
			case c.inSample(p):
			case c.kexc[i] != Holds:
				c.counted = append(c.counted, p)
				o := Observation{Step: known[i].Step}
				if known[i].Below > 0 {
					o = knownBehind(known[i])
				}
				o.Peer = p
				c.add(o, c.kexc[i])
			case known != nil && !sp.Dynamic() && known[i].Seen && known[i].Step >= threshold:
				c.counted = append(c.counted, p)
				if c.pace != nil {
					c.pace.Observe(p, known[i].Step, now)
				}
				c.add(Observation{Peer: p, Step: known[i].Step}, Holds)
			default:
				c.launch(p, now, false)
			}
		}
		c.cached = len(c.counted)
		c.want = len(c.asked) + len(c.counted)
		if c.want == 0 {
			return c.decide(now, heardLately, false)
		}
		c.budget = c.cfg.Replacements * c.want
		return c.progress(now)
	}
	// A draw for replacements.
	for _, p := range peers {
		if !c.inSample(p) {
			c.spares = append(c.spares, p)
		}
	}
	k := c.replacing
	c.replacing = 0
	if len(c.spares) == 0 {
		k = 0 // no peer left to draw: the check makes do
	}
	out := c.replace(k, now)
	if out.Draw > 0 {
		return out
	}
	return c.progress(now)
}

// known is Known.
func (c *Checker) known(peers []Known, heardLately bool, now float64) CheckOut {
	if c.phase != drawing || !c.cfg.Spec.Global() {
		return c.current(now)
	}
	sp := c.cfg.Spec
	static := !sp.Dynamic()
	threshold := c.self - Step(sp.BaseStaleness())
	if static {
		for _, k := range peers {
			if k.Below > 0 && k.Below <= threshold {
				c.failKnownBehind(k)
				c.phase = asking
				return c.decide(now, heardLately, true)
			}
		}
	}
	for _, k := range peers {
		if static && k.Seen && k.Step >= threshold {
			c.add(Observation{Peer: k.Peer, Step: k.Step}, Holds)
			continue
		}
		if !k.Seen {
			k.Step = -1
		}
		c.cands = append(c.cands, k)
	}
	c.cached = len(c.obs)
	slices.SortStableFunc(c.cands, func(a, b Known) int {
		switch {
		case a.Step < b.Step:
			return -1
		case a.Step > b.Step:
			return 1
		}
		return 0
	})
	c.phase = asking
	if len(c.cands) == 0 {
		return c.decide(now, heardLately, false)
	}
	return c.progress(now)
}

// failKnownBehind makes k, a peer known to be below the check's
// threshold, the check's one observation, at its last known step (at
// most Below − 1), counted without asking.
func (c *Checker) failKnownBehind(k Known) {
	c.obs, c.exc = append(c.obs[:0], knownBehind(k)), append(c.exc[:0], Holds)
	c.slow, c.far = 0, 0
	c.cached, c.knownBehind = 1, true
}

// knownBehind is the observation a peer known below a threshold stands
// for: its last known step, at most Below − 1.
func knownBehind(k Known) Observation {
	step := k.Below - 1
	if k.Seen {
		step = min(step, k.Step)
	}
	return Observation{Peer: k.Peer, Step: step}
}

// add counts an observation with the pace rule's verdict on it.
func (c *Checker) add(o Observation, e Excuse) {
	c.obs, c.exc = append(c.obs, o), append(c.exc, e)
	switch e {
	case Slow:
		c.slow++
	case Far:
		c.far++
	}
}

// answer is Answer.
func (c *Checker) answer(peer string, o Observation, counts bool, now float64) CheckOut {
	if !c.settle(peer) {
		return c.current(now)
	}
	c.answered++
	sp := c.cfg.Spec
	if counts {
		e := Holds
		if c.pace != nil {
			c.pace.Observe(peer, o.Step, now)
			e = c.pace.Judge(peer, o.Step, c.self-Step(sp.BaseStaleness()), now)
		}
		c.add(o, e)
		if !sp.Dynamic() && e == Holds && Behind(c.self, sp.BaseStaleness(), o.Step) {
			return c.decide(now, false, true)
		}
	} else if !sp.Global() {
		if out := c.replace(1, now); out.Draw > 0 {
			return out
		}
	}
	return c.progress(now)
}

// failed is Failed.
func (c *Checker) failed(peer string, now float64) CheckOut {
	if !c.settle(peer) {
		return c.current(now)
	}
	if !c.cfg.Spec.Global() {
		if out := c.replace(1, now); out.Draw > 0 {
			return out
		}
	}
	return c.progress(now)
}

// tick is Tick.
func (c *Checker) tick(now float64) CheckOut {
	switch c.phase {
	case waiting:
		if now >= c.wakeAt {
			return c.begin(now)
		}
		return c.current(now)
	case asking:
		k := 0
		for i := range c.out {
			if q := &c.out[i]; !q.hedged && q.at+c.timing.Hedge <= now {
				q.hedged = true
				k++
			}
		}
		c.hedged += k
		if out := c.replace(k, now); out.Draw > 0 {
			return out
		}
		return c.progress(now)
	}
	return c.current(now)
}

// woken is Woken.
func (c *Checker) woken(now float64) CheckOut {
	switch c.phase {
	case asking, drawing:
		c.wokenUp = true
		return c.current(now)
	case waiting:
		c.wakeAt = min(c.wakeAt, c.checked+min(c.timing.Wake, c.backoff))
		return c.tick(now)
	}
	return CheckOut{}
}

// current is the output of an input that changes nothing: what the
// Checker still waits for.
func (c *Checker) current(now float64) CheckOut {
	switch c.phase {
	case drawing:
		if c.cfg.Spec.Global() {
			return CheckOut{Known: true}
		}
		return CheckOut{Draw: c.draw}
	case waiting:
		return CheckOut{Wake: c.wakeAt}
	case asking:
		return c.progress(now)
	}
	return CheckOut{}
}

// inSample reports whether p is already in the check's sample: asked, or
// counted without asking.
func (c *Checker) inSample(p string) bool {
	return slices.Contains(c.asked, p) || slices.Contains(c.counted, p)
}

// settle removes peer from the queries in flight; false if it was not.
func (c *Checker) settle(peer string) bool {
	if c.phase != asking {
		return false
	}
	i := slices.IndexFunc(c.out, func(q pending) bool { return q.peer == peer })
	if i < 0 {
		return false
	}
	c.out = slices.Delete(c.out, i, i+1)
	return true
}

// launch asks p.
func (c *Checker) launch(p string, now float64, global bool) {
	c.asked = append(c.asked, p)
	c.out = append(c.out, pending{peer: p, at: now, hedged: global})
	c.ask = append(c.ask, p)
}

// replace asks up to k fresh draws, within the budget. When it runs out of
// spares it asks for a draw (CheckOut.Draw) and owes the rest.
func (c *Checker) replace(k int, now float64) CheckOut {
	for ; k > 0 && c.budget > 0; k-- {
		if len(c.spares) == 0 {
			c.replacing += k
			c.phase, c.draw = drawing, c.want+len(c.asked)+len(c.counted)
			return CheckOut{Draw: c.draw, Ask: c.flush()}
		}
		p := c.spares[0]
		c.spares = c.spares[1:]
		if c.inSample(p) {
			k++
			continue
		}
		c.budget--
		c.launch(p, now, false)
	}
	return CheckOut{}
}

// flush returns the queries to launch and starts a new list (the caller
// copies them before the next launch: put).
func (c *Checker) flush() []string {
	a := c.ask
	c.ask = c.ask[:0]
	return a
}

// progress launches a global check's next queries, ends a check that has
// all it waits for, and otherwise says what to do and when to tick.
func (c *Checker) progress(now float64) CheckOut {
	if c.cfg.Spec.Global() {
		limit := c.cfg.GlobalQueries
		if limit <= 0 {
			limit = len(c.cands)
		}
		for len(c.out) < limit && c.next < len(c.cands) {
			c.launch(c.cands[c.next].Peer, now, true)
			c.next++
		}
		if len(c.out) == 0 {
			return c.decide(now, false, false)
		}
		return CheckOut{Ask: c.flush()}
	}
	if len(c.out) == 0 || len(c.obs) >= c.want {
		return c.decide(now, false, false)
	}
	out := CheckOut{Ask: c.flush()}
	for _, q := range c.out {
		if !q.hedged {
			if t := q.at + c.timing.Hedge; out.Wake == 0 || t < out.Wake {
				out.Wake = t
			}
		}
	}
	return out
}

// decide ends a check: the decision, the isolation policy, and, if the
// node must wait, when it checks next.
func (c *Checker) decide(now float64, heardLately, early bool) CheckOut {
	c.checks++
	held := c.obs
	if c.slow+c.far > 0 {
		c.held = c.held[:0]
		for i, o := range c.obs {
			if c.exc[i] == Holds {
				c.held = append(c.held, o)
			}
		}
		held = c.held
	}
	d := c.decider.Decide(c.self, now, held)
	iso := Isolated(c.cfg.Spec, len(c.asked), c.answered, len(c.obs), heardLately)
	out := CheckOut{
		Done: true, Decision: d, Isolated: iso,
		Stats: CheckStats{Asked: len(c.asked), Answered: c.answered, Observed: len(c.obs),
			Hedged: c.hedged, Cached: c.cached, EarlyFail: early, KnownBehind: c.knownBehind,
			Slow: c.slow, Far: c.far},
	}
	c.out = c.out[:0]
	c.checked = now
	if d.Pass && !iso {
		c.phase = passed
		out.Pass = true
		return out
	}
	c.phase = waiting
	if c.checks == 1 {
		c.backoff = c.timing.First
	} else {
		c.backoff = min(2*c.backoff, c.timing.Recheck)
	}
	c.wakeAt = now + c.backoff
	if c.wokenUp {
		c.wokenUp = false
		c.wakeAt = min(c.wakeAt, now+min(c.timing.Wake, c.backoff))
	}
	out.Wake = c.wakeAt
	return out
}

// Isolated is the isolation policy. A check passes only on what peers say,
// so a check that hears from no peer must not pass: a node cut off from
// all its peers would otherwise run on with no barrier at all. A check is
// isolated, and fails, when it asked peers and none answered (every query
// failed), or when it had no peer to ask (and counted none without asking)
// while the node has heard lately from a peer that has not left (such a
// peer was found dead, and may come back). A node with no peer that has
// heard from none lately is alone: the first node of a job, or one whose
// peers all left. ASP and β = 0 never check, so never isolate.
func Isolated(sp Spec, asked, answered, observed int, heardLately bool) bool {
	switch {
	case sp.Scope() == NoCheck || (sp.Probabilistic() && sp.Beta == 0):
		return false
	case answered > 0:
		return false
	case asked > 0:
		return true
	case observed > 0: // a global check counted peers seen lately without asking
		return false
	}
	return heardLately
}
