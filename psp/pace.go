package psp

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Pace: a sampled barrier that does not wait for a peer whose lag is its
// speed.
//
// Under pBSP and pSSP a peer that steps four times slower than the rest
// is always more than s steps behind them: every check that samples it
// fails, and the fast nodes run at a pace between theirs and its. Waiting
// does not make its lag smaller (it steps no faster for being waited
// for), and under an exchange that merges models it takes in its peers'
// work at every step, so its step count says how many steps it made, not
// how old its model is. So a sampled check learns each peer's pace and
// holds the node only for a peer that is behind at about the node's own
// pace and close enough to be waited for:
//
//   - A peer's pace I is its seconds per step: an EWMA of Δt/Δstep
//     between successive observations of it at different steps (the
//     answers to this node's queries, and the steps it knows without
//     asking at or above a check's threshold or below it by a promise;
//     not those it knows behind without one: JudgeUnasked), each sample
//     at most SampleCap times the estimate it
//     updates. Until two observations, the node's own reference r. A peer
//     seen at one step for t seconds steps at least every t/OverdueShare
//     seconds: that is its pace if it is longer, so a peer that stops
//     turns slow within OverdueShare·Factor·r.
//   - The reference r is the node's own seconds per step: its step
//     interval (waits included), but at least its compute time c (waits
//     excluded) and at most RefCap·c, smoothed over its barriers. Peers'
//     paces include their waits, so under a barrier that holds every
//     node often (pBSP in a large job) a node's peers step slower than
//     its compute alone; the cap keeps a node held back by a slow peer
//     from taking that peer's pace for its own.
//   - A peer behind the check's threshold by k ≥ 1 steps is slow when
//     I > Factor·r, and far behind when k·I > Horizon·r (waiting for it
//     would take longer than Horizon of the node's steps). A slow or
//     far-behind peer does not hold the node: the check counts it as
//     excused. Any other behind peer holds it, as under plain pSSP.
//
// So a peer within Factor of the node's pace and at most Horizon of its
// steps behind the threshold is waited for (SSP's bound among peers of a
// pace); a slower one, one that stopped, and one far behind (a peer that
// was slow and sped up, one that stalled for a while) are not, and no
// wait on one peer lasts more than about Horizon·r. Each node learns
// the paces of the peers it samples and decides alone: there is no
// coordinator, and a peer's paces are learnt from the steps it reports,
// not from what it says of its speed.
//
// Time is the caller's clock in seconds. A clock that steps back
// re-anchors a peer's record without learning from it; one that steps
// forward makes every peer look stopped for one check (excused), and its
// samples are capped, so the estimates are back within a few
// observations.

// PaceConfig sets the pace rule of sampled static barriers (pBSP, pSSP).
// The zero value turns it off: the paper's pBSP and pSSP.
type PaceConfig struct {
	// Factor: a peer stepping more than Factor times slower than the
	// node's reference (its own seconds per step) is slow (> 1; 0: the
	// rule is off).
	Factor float64
	// Horizon: a peer that would need more than Horizon of the node's
	// own steps to reach the check's threshold is far behind (> 0).
	Horizon float64
}

// DefaultPaceConfig is the node's and the simulator's default: a peer two
// times slower than the node is slow, and one more than 8 of the node's
// steps from the threshold is far behind.
func DefaultPaceConfig() PaceConfig { return PaceConfig{Factor: 2, Horizon: 8} }

// On reports whether the rule is on.
func (c PaceConfig) On() bool { return c.Factor > 0 }

// Validate checks the fields (the zero value is valid: off).
func (c PaceConfig) Validate() error {
	switch {
	case c == PaceConfig{}:
		return nil
	case !(c.Factor > 1) || math.IsInf(c.Factor, 0):
		return errPace("factor %v must be a finite number above 1 (0: off)", c.Factor)
	case !(c.Horizon > 0) || math.IsInf(c.Horizon, 0):
		return errPace("horizon %v must be a finite positive number of steps", c.Horizon)
	}
	return nil
}

// String is the rule as ParsePace reads it: "FACTOR:HORIZON", or "off".
func (c PaceConfig) String() string {
	if !c.On() {
		return "off"
	}
	return strconv.FormatFloat(c.Factor, 'g', -1, 64) + ":" + strconv.FormatFloat(c.Horizon, 'g', -1, 64)
}

// ParsePace parses "FACTOR:HORIZON" (2:8) or "off" into a valid
// PaceConfig.
func ParsePace(s string) (PaceConfig, error) {
	if s == "off" {
		return PaceConfig{}, nil
	}
	a, b, ok := strings.Cut(s, ":")
	if !ok {
		return PaceConfig{}, errPace("%q: want FACTOR:HORIZON (for example 2:8) or off", s)
	}
	x, err1 := strconv.ParseFloat(a, 64)
	y, err2 := strconv.ParseFloat(b, 64)
	if err1 != nil || err2 != nil {
		return PaceConfig{}, errPace("%q: want FACTOR:HORIZON, two numbers (for example 2:8), or off", s)
	}
	c := PaceConfig{Factor: x, Horizon: y}
	if err := c.Validate(); err != nil {
		return PaceConfig{}, err
	}
	return c, nil
}

// ErrPace is wrapped by every error PaceConfig.Validate returns.
var ErrPace = errors.New("invalid pace rule")

func errPace(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrPace, fmt.Sprintf(format, a...))
}

// Excuse is the pace rule's verdict on one observed peer.
type Excuse uint8

// The verdicts. Only Holds makes the node wait (and only for a peer
// behind the threshold).
const (
	Holds Excuse = iota // behind at the node's pace, or not behind: the barrier's usual test
	Slow                // behind, and stepping more than Factor times slower than the node
	Far                 // behind by more than the node would wait for: Horizon of its steps
)

func (e Excuse) String() string {
	switch e {
	case Slow:
		return "slow"
	case Far:
		return "far"
	}
	return "holds"
}

// OverdueShare: a peer seen at one step for t seconds steps at least
// every t/OverdueShare seconds, as the rule reads it. A peer that stopped
// turns slow within OverdueShare·Factor·r; at 2 a peer of the paper's
// time model ((Exp(1)+1) × a constant) on a long step is taken for slow
// about once in a thousand steps (at 1, once in twenty).
const OverdueShare = 2

// RefCap: the reference is the node's own step interval (waits
// included), at least its compute time c and at most RefCap·c.
const RefCap = 2

// refAlpha is the weight of the newest value in the reference's EWMA.
const refAlpha = 0.05

// SampleCap bounds one pace sample at this many times the estimate it
// updates (a clock that stepped forward, a peer not heard from for long).
const SampleCap = 4

// paceRecord is what a node learnt of one peer's pace.
type paceRecord struct {
	step     Step
	since    float64 // when step was first seen
	interval float64 // EWMA seconds per step; 0 until two steps were seen
	seen     float64 // last observation, for eviction
}

// Pace holds the paces a node learnt of its peers and judges observations
// by them. One per node; not safe for concurrent use.
type Pace struct {
	cfg   PaceConfig
	ref   float64 // the node's reference seconds per step (SetCompute)
	peers map[string]*paceRecord
}

// NewPace returns an empty Pace for cfg.
func NewPace(cfg PaceConfig) *Pace { return &Pace{cfg: cfg, peers: make(map[string]*paceRecord)} }

// Config is the rule's configuration.
func (p *Pace) Config() PaceConfig { return p.cfg }

// Len is the number of peers with a record.
func (p *Pace) Len() int { return len(p.peers) }

// SetCompute takes the node's own mean compute seconds per step c
// (waits excluded) and its mean step interval (waits included; 0 if
// unknown) and folds them into the reference the rule measures peers
// against: the interval, at least c and at most RefCap·c, smoothed. While
// c is unknown (0) nothing is excused.
func (p *Pace) SetCompute(c, interval float64) {
	if !(c > 0) || math.IsInf(c, 0) {
		return
	}
	if interval > 0 && !math.IsInf(interval, 0) {
		c = min(max(c, interval), RefCap*c)
	}
	if p.ref > 0 {
		c = refAlpha*c + (1-refAlpha)*p.ref
	}
	p.ref = c
}

// Reference is the node's reference seconds per step (0 while unknown).
func (p *Pace) Reference() float64 { return p.ref }

// Observe records that peer was at step at time now.
func (p *Pace) Observe(peer string, step Step, now float64) {
	if math.IsNaN(now) || math.IsInf(now, 0) {
		return
	}
	r, ok := p.peers[peer]
	if !ok {
		p.makeRoom()
		r = &paceRecord{step: step, since: now}
		p.peers[peer] = r
	}
	r.seen = now
	switch {
	case !ok:
		return
	case step < r.step: // it restarted, or lied: learn it afresh
		*r = paceRecord{step: step, since: now, seen: now}
		return
	case now < r.since: // the clock stepped back: re-anchor, learn nothing
		r.step, r.since = max(r.step, step), now
		return
	case step == r.step:
		return
	}
	sample := (now - r.since) / float64(step-r.step)
	if base := r.base(p.ref); base > 0 {
		sample = min(sample, SampleCap*base)
	}
	if sample > 0 {
		if r.interval == 0 {
			r.interval = sample
		} else {
			r.interval = rateAlpha*sample + (1-rateAlpha)*r.interval
		}
	}
	r.step, r.since = step, now
}

// base is a record's pace before overdue time counts: learnt, else ref.
func (r *paceRecord) base(ref float64) float64 {
	if r.interval > 0 {
		return r.interval
	}
	return ref
}

// Interval is peer's pace at now in seconds per step, as the rule reads
// it: what it learnt, or the time the peer has been seen at its step over
// OverdueShare if that is longer; 0 while it has seen the peer at one
// step only and for no time. Interval/Reference says how many of this
// node's steps one of the peer's takes: what an exchange can weigh the
// peer's models by, beside their step lag.
func (p *Pace) Interval(peer string, now float64) float64 {
	r, ok := p.peers[peer]
	if !ok {
		return 0
	}
	return r.effective(0, now)
}

// effective is the record's pace at now, with ref standing in for an
// unknown one: its base, or the time it has been seen at its step over
// OverdueShare if that is more.
func (r *paceRecord) effective(ref, now float64) float64 {
	return max(r.base(ref), (now-r.since)/OverdueShare)
}

// Judge is the rule's verdict on peer, observed at step, for a node whose
// check has the given threshold (its step less the staleness bound), at
// now. A peer at or above the threshold Holds: it passes the barrier's
// test as it is. The peer should have been observed (Observe) first.
func (p *Pace) Judge(peer string, step, threshold Step, now float64) Excuse {
	k := threshold - step
	if k <= 0 || p.ref == 0 || !p.cfg.On() {
		return Holds
	}
	iv := p.ref
	if r, ok := p.peers[peer]; ok {
		iv = r.effective(p.ref, now)
	}
	switch {
	case iv > p.cfg.Factor*p.ref:
		return Slow
	case float64(k)*iv > p.cfg.Horizon*p.ref:
		return Far
	}
	return Holds
}

// JudgeUnasked is Judge for a peer the node knows at step without asking
// it (from an answer or the work it took in earlier), to spare the round
// trip: Holds unless the peer's record is fresh, that is its pace is
// learnt (two observations at different steps) and its step last changed
// within OverdueShare of that pace; then Judge's verdict on the step the
// peer may have reached since: the later of step and the record's, plus
// the steps its pace allows since the record's step changed (at least
// one, rounded up). A record that is not fresh leaves the peer to be
// asked, so no peer is excused for long on what the node learnt of it: a
// peer the node has stopped hearing from is asked, and its answer judged
// as any. A peer known past its record's step that cannot be slow (it
// made those steps within Factor of the node's pace, at most) Holds. This
// call observes nothing: a peer known behind without a
// promise is not observed into its record (a step taken from a model that
// arrived a while ago, observed as if seen now, makes peers look slower
// than they are: in a testnet of 64 on 70 ms links that cost the fast
// nodes 1-6 % of their steps).
func (p *Pace) JudgeUnasked(peer string, step, threshold Step, now float64) Excuse {
	r, ok := p.peers[peer]
	if !ok || !(r.interval > 0) || now-r.since > OverdueShare*r.interval {
		return Holds
	}
	// Known past the record's step: it made those steps within now −
	// since, which bounds its pace from above without being learnt (an
	// interval learnt across a start-up wait can be much longer than the
	// peer's pace). A bound within the rule's factor is no slow peer.
	if step > r.step && (now-r.since)/float64(step-r.step) <= p.cfg.Factor*p.ref {
		return Holds
	}
	since := Step(max(1, math.Ceil((now-r.since)/r.interval)))
	return p.Judge(peer, max(step, r.step)+since, threshold, now)
}

// makeRoom forgets the least recently observed peer at the cap.
func (p *Pace) makeRoom() {
	if len(p.peers) < maxTracked {
		return
	}
	oldest, t := "", math.Inf(1)
	for k, r := range p.peers {
		if r.seen < t {
			oldest, t = k, r.seen
		}
	}
	delete(p.peers, oldest)
}
