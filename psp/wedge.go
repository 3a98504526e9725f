package psp

// A node can find itself far ahead of every peer it asks and stay there:
// it adopted a step no honest peer has (one peer's claim, at its join),
// or resumed a checkpoint of a job that has since started over. Under a
// bounded barrier it then waits for ever, since its peers would have to
// climb to its step first. Wedge notices that state, so the caller can
// take the job's step again (the median of several peers', as at a join).
//
// An honest node is never far ahead of every peer it samples: it passed
// its last barrier with a sample at most the staleness behind it, and it
// has made one step since. Wedge calls a check far ahead when every
// observation in it lags the node by more than Gap steps, and the node
// wedged after Checks such checks in a row spanning at least Seconds.

// Wedge watches a node's failed barrier checks for being far ahead of
// every peer. The zero value is not ready: use NewWedge.
type Wedge struct {
	// Gap is how far behind the node every observed step of a check must
	// be for the check to count.
	Gap Step
	// Checks is how many such checks in a row, and Seconds how long from
	// the first to the last, before the node is wedged.
	Checks  int
	Seconds float64

	run   int     // far-ahead checks in a row
	since float64 // when the first of them was
}

// NewWedge is the watch for a barrier of staleness s (< 0: unbounded, such
// a node never waits, so never wedges): a gap of 64 staleness bounds and
// at least 1024 steps, ten checks over ten seconds.
func NewWedge(s int) *Wedge {
	gap := Step(1024)
	if g := 64 * Step(s+1); s >= 0 && g > gap {
		gap = g
	}
	return &Wedge{Gap: gap, Checks: 10, Seconds: 10}
}

// Check takes a failed check of a node that has completed self steps, at
// now (seconds), with what the check observed; it reports whether the
// node is wedged. A check with no observation, or with one within Gap,
// starts the count again.
func (w *Wedge) Check(self Step, now float64, obs []Observation) bool {
	if len(obs) == 0 || self < w.Gap {
		w.run = 0
		return false
	}
	for _, o := range obs {
		if o.Step >= self-w.Gap {
			w.run = 0
			return false
		}
	}
	if w.run == 0 {
		w.since = now
	}
	w.run++
	return w.run >= w.Checks && now-w.since >= w.Seconds
}

// Reset starts the count again (the barrier passed, or the node moved).
func (w *Wedge) Reset() { w.run = 0 }
