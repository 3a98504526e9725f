package psp

import (
	"cmp"
	"math"
	"slices"
)

// The population rule. A node guesses the number of nodes of its job
// (which scales its learning rate, and so the size of its updates, which
// its peers hold to a norm bound: nodes should agree on it) from its own
// estimate (its overlay's, from the density of its zone of the ID space
// and its random-key lookups) and the estimates its peers report, each
// peer's latest. Reports are claims, and identities are cheap, so:
//
//   - Votes, not a mean: the guess is the weighted lower median of the
//     node's own estimate and the reports, so a minority of the weight,
//     whatever it reports, cannot move it beyond the range of the others'
//     values. Taking the lower of two middle values, not their mean,
//     keeps two liars beside two honest reports from setting it halfway
//     (the mean of 3 and 1e9).
//   - A reporter weighs by how long the node has known it
//     (ReporterWeight): from NewReporterWeight for one just met to 1 after
//     ReporterAge. A crowd of fresh identities weighs a quarter of as many
//     peers known for a minute.
//   - The node's own estimate votes (SelfWeight), as a peer known as
//     long as the node has run, and so does every live peer it knows that
//     has not reported (until they say otherwise, its peers are taken to
//     see what it sees). Liars quick to report, heard before the honest
//     peers, cannot set it; and a joiner, whose own estimate knows only
//     its bootstrap peers and weighs as a new reporter's, follows the
//     job's reports once it has a few.
//   - Never fewer than the node and the live peers it knows.
//
// With k liars among h honest nodes (k ≤ h − 1), a node that knows every
// peer (a small job) has h honest votes (its own, its honest peers' that
// reported, and one for each that did not) against k at most, each
// weighed by how long it has been known, the unheard ones as long as the
// node has run: where liars and honest peers are of one standing (they
// started the job together, or the liars came later), the guess is an
// honest estimate. In a larger job the same holds while liars are fewer
// than half the peers the node knows. The node also bounds how fast its
// guess may change once it has one (BoundRate).

// Report is one peer's latest population estimate and how long (seconds)
// the node has known the peer.
type Report struct {
	N   float64
	Age float64
}

const (
	// MinReports is the fewest reports whose median counts for a node
	// without an estimate of its own.
	MinReports = 3
	// ReporterAge is how long (seconds) a node knows a peer before its
	// report weighs fully.
	ReporterAge = 60
	// NewReporterWeight is the weight of a report from a peer just met.
	NewReporterWeight = 0.25
	// PopulationDoubling is the fastest a settled node's guess may double
	// or halve, in seconds (BoundRate).
	PopulationDoubling = 10
)

// ReporterWeight is the weight of a report from a peer the node has known
// for age seconds.
func ReporterWeight(age float64) float64 {
	return NewReporterWeight + (1-NewReporterWeight)*min(1, max(age, 0)/ReporterAge)
}

// SelfWeight is the weight of the own estimate of a node that has run
// for age seconds, beside m reports, when it knows known live peers: a
// reporter known for its age, for itself and each known peer that has not
// reported.
func SelfWeight(age float64, m, known int) float64 {
	return ReporterWeight(age) * float64(1+max(0, known-m))
}

// Population is a node's guess of its job's size from its own estimate
// own (0: none), its peers' reports, the number of live peers it knows
// and how long it has run (age, seconds; see above).
func Population(own float64, reports []Report, known int, age float64) float64 {
	floor := float64(1 + known)
	votes := make([]vote, 0, len(reports)+1)
	for _, r := range reports {
		if !(r.N >= 1) || math.IsInf(r.N, 0) {
			continue
		}
		votes = append(votes, vote{r.N, ReporterWeight(r.Age)})
	}
	switch {
	case own >= 1 && !math.IsInf(own, 0):
		votes = append(votes, vote{own, SelfWeight(age, len(votes), known)})
	case len(votes) < MinReports:
		return floor
	}
	return max(lowerMedian(votes), floor)
}

// vote is one estimate and its weight.
type vote struct{ n, w float64 }

// lowerMedian is the smallest value of votes (not empty) at which the
// weight at or below it reaches half the total.
func lowerMedian(votes []vote) float64 {
	slices.SortFunc(votes, func(a, b vote) int { return cmp.Compare(a.n, b.n) })
	total := 0.0
	for _, v := range votes {
		total += v.w
	}
	sum := 0.0
	for _, v := range votes {
		sum += v.w
		if sum >= total/2 {
			return v.n
		}
	}
	return votes[len(votes)-1].n
}

// BoundRate is next held within PopulationDoubling's rate of prev, dt
// seconds later: a guess may double or halve once per PopulationDoubling
// seconds, no faster. A prev below 1 (none yet) bounds nothing.
func BoundRate(prev, next, dt float64) float64 {
	if !(prev >= 1) {
		return next
	}
	f := math.Exp2(max(dt, 0) / PopulationDoubling)
	return min(max(next, prev/f), prev*f)
}
