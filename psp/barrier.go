package psp

import "slices"

// Pass is the barrier test shared by every kind: a node that has completed c
// iterations may start the next one iff every observed step is at least
// c-s. A negative s means no bound (ASP). An empty observation passes.
func Pass(c Step, s int, observed []Step) bool {
	return Lagging(c, s, observed) == 0
}

// Lagging counts the observed steps below the threshold c-s (0 if s < 0).
func Lagging(c Step, s int, observed []Step) int {
	n := 0
	for _, o := range observed {
		if Behind(c, s, o) {
			n++
		}
	}
	return n
}

// Behind reports whether one observed step o holds back a node that has
// completed c iterations under staleness s: o < c-s (never if s < 0). One
// such observation fails a static barrier whatever the others are, so a
// check may stop at the first.
func Behind(c Step, s int, o Step) bool {
	return s >= 0 && o < c-Step(s)
}

// Observation is what a node learns about one peer when it asks for its
// step: the peer's identity (any stable string), its step, and, when the
// peer reports it, the mean time in seconds it took per step recently.
type Observation struct {
	Peer     string
	Step     Step
	Interval float64 // seconds per step as the peer reports it; 0 if unknown
}

// Decision is the outcome of one barrier check.
type Decision struct {
	Pass      bool
	Staleness int // the staleness applied: s, or S_L plus a DSSP allowance; -1 for ASP
	Lagging   int // observed peers below the threshold
	Granted   int // extra steps a DSSP controller granted at this check
}

// Decider decides one barrier check. self is the number of iterations the
// node has completed, now the caller's clock in seconds (only the dynamic
// kinds use it), and observed what the node learnt from the peers it asked:
// a fresh sample of β peers for the probabilistic kinds, every known peer for
// the global ones. A Decider for a dynamic kind keeps state and is not safe
// for concurrent use; the static kinds are stateless.
type Decider interface {
	Decide(self Step, now float64, observed []Observation) Decision
}

// NewDecider returns the Decider for a spec. The static kinds (ASP, BSP,
// SSP, pBSP, pSSP) are the stateless test at BaseStaleness; the dynamic
// ones (DSSP, pDSSP) return a fresh *PDSSPDecider (one per node): in a
// network without a server, DSSP is pDSSP over every known peer. The
// simulator also offers the server-based DSSP of the reference as a
// baseline, through DSSPController.
func NewDecider(s Spec) Decider {
	if s.Dynamic() {
		return NewPDSSP(s.Staleness, s.Upper)
	}
	return static{s.BaseStaleness()}
}

type static struct{ s int }

func (d static) Decide(self Step, _ float64, observed []Observation) Decision {
	lag := 0
	for _, o := range observed {
		if Behind(self, d.s, o.Step) {
			lag++
		}
	}
	return Decision{Pass: lag == 0, Staleness: d.s, Lagging: lag}
}

// JoinStep is the step a node adopts when it joins a running job: the
// median (rounded down) of the steps it observes from up to 16 live peers,
// 0 if it observes none. A joiner at the median neither holds back the
// nodes around it nor, having fetched the current model, trains from
// scratch. The simulator and the real node use this rule.
func JoinStep(observed []Step) Step {
	if len(observed) == 0 {
		return 0
	}
	s := slices.Clone(observed)
	slices.Sort(s)
	return s[(len(s)-1)/2]
}

// MaxStep is the largest step a node takes or believes: 2^62, beyond any
// job's length (a million steps a second for 146,000 years), and far
// enough below the int64 limit that a step plus a staleness bound, or a
// node's steps past a claimed one, never wraps around to a negative
// step. A peer's claim of a larger step is malformed.
const MaxStep Step = 1 << 62

// JoinSample is how many peers a joiner asks for their step.
const JoinSample = 16
