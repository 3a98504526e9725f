package psp

// What a Checker is given and gives back: its policy (CheckConfig), the
// events' arguments (CheckStart, Known) and its output (CheckOut,
// CheckStats). The machine itself is in check.go.

// CheckConfig is the barrier policy a Checker applies.
type CheckConfig struct {
	Spec Spec
	// Replacements × β is the most fresh draws a sampled check makes to
	// replace failed, refused or slow peers.
	Replacements int
	// GlobalQueries bounds a global check's queries in flight (0: no
	// bound).
	GlobalQueries int
	Timing        TimingConfig
	// Pace is the pace rule of pBSP and pSSP checks (Pace); the zero
	// value is off. Other kinds ignore it.
	Pace PaceConfig
}

// Known is what a node knows of one peer's step without asking: for a
// global check, every known peer, with the highest step it has shown.
type Known struct {
	Peer string
	Step Step
	Seen bool // false: no step known (Step is ignored)
	// Below > 0: the peer's step is known to be below Below until it
	// says otherwise: its last answer was below Below, and it promised to
	// tell the node when it reaches Below (a progress notice). Read by
	// the checks of static barriers (all but DSSP and pDSSP).
	Below Step
}

// CheckStart begins a barrier. Population is the estimated number of
// nodes (a sampled barrier's re-check interval follows it); Compute is
// the node's mean compute seconds per step (waits excluded), Interval its
// mean seconds per step (waits included) and RTT its smoothed query
// round trip in seconds, each 0 while unknown.
type CheckStart struct {
	Self       Step
	Population float64
	Compute    float64
	Interval   float64
	RTT        float64
	Now        float64
}

// CheckOut is what Ready returns: what the caller must do now (Ask, then
// Draw or Known, before any other input), and what a check that ended
// decided.
type CheckOut struct {
	// Draw > 0: draw up to Draw peers uniformly (the caller's sampler;
	// every known peer when it knows fewer) and pass them to Drawn before
	// any other call.
	Draw int
	// Known: list every known peer with its known step and pass them to
	// Known before any other call (a global check).
	Known bool
	// Ask: query these peers for their steps now, each within
	// Timing().Timeout, and report each outcome to Answer or Failed.
	// Outcomes of queries of a check that has ended are no longer wanted.
	Ask []string
	// Wake > 0: call Tick at this time (a hedge is due, or the next
	// check); 0: nothing to wait for but answers.
	Wake float64
	// Done: a check ended, with Decision, Isolated and Stats.
	Done     bool
	Pass     bool // the barrier passed (Done is set too)
	Decision Decision
	Isolated bool // the check heard from no peer: it failed whatever Decision says
	Stats    CheckStats
}

// CheckStats counts what a check that ended did.
type CheckStats struct {
	Asked     int  // peers asked
	Answered  int  // peers that answered, whether or not the answer counted
	Observed  int  // observations the decision counted
	Hedged    int  // slow peers a fresh draw was asked beside
	Cached    int  // peers counted without asking (known at or above the threshold)
	EarlyFail bool // the check ended at the first answer behind its threshold
	// KnownBehind: the check failed, unasked, on a drawn peer known to be
	// below its threshold (Known.Below); EarlyFail is set too.
	KnownBehind bool
	// Slow and Far count the peers behind the threshold that the pace
	// rule excused (Pace.Judge): the check did not wait for them.
	Slow, Far int
}
