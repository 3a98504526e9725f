package psp

// Population is the rule by which a node guesses the number of nodes of
// its job (which scales its learning rate), given its overlay's estimate
// (0: none), the median of the estimates its peers reported (haveRep:
// enough of them did, ReportQuorum) and the number of live peers it
// knows: the overlay's estimate, unless it is off by more than a factor
// of two from the reports' median, which then wins; without an estimate,
// the median; and never fewer than the node and the peers it knows.
func Population(est, rep float64, haveRep bool, known int) float64 {
	floor := float64(1 + known)
	switch {
	case est >= 1 && (!haveRep || (est >= rep/2 && est <= 2*rep)):
		return max(est, floor)
	case haveRep:
		return max(rep, floor)
	}
	return floor
}

// MinReports is the fewest peers' reports whose median counts.
const MinReports = 3

// ReportQuorum is how many peers must have reported their estimate for
// their median to count, for a node that knows known live peers: half of
// them, and at least MinReports. Peers that lie report as often as they
// like, the honest ones when they happen to ask or be asked: at the start
// of a run of 100 nodes at one step a second, ten liars sending twenty
// queries a second were most of the first peers heard from, and a node
// took their 1e9 for a while (its population's p95 error 29 %). Below the
// quorum the node keeps its overlay's estimate, which a joiner, whose
// quorum is small (it knows few peers), does not need to.
func ReportQuorum(known int) int { return max(MinReports, (known+1)/2) }
