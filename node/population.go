package node

import "slices"

// population is the node's best guess of the number of nodes: the overlay's
// estimate, unless it is off by more than a factor of two from the median
// of the estimates peers reported lately (reportedPopulation), which then
// wins; without an overlay estimate, that median; and never fewer than
// itself plus the live peers it knows.
//
// It sets the learning rate (Config.ScaleLR), and through it the size of
// the node's updates, which its peers hold to the norm bound, so nodes
// should agree on it. The floor makes a small job agree exactly: in a job
// of four, estimates of 3 (and peer reports of 2) beside others' 4 made
// some updates more than 4 times the median of others' own. A joiner's
// overlay knows only its bootstrap peers at its first step and estimates a
// population of about 4 (and caches that for a second, so the reports of
// the peers it has just asked do not reach the estimate in time): it
// scaled its rate by 1/4 where its peers used 1/50, and every peer refused
// its first update, a dozen times the size of theirs. In a 50-node testnet
// with churn these were 148 of 151 norm refusals.
func (n *Node) population() float64 {
	est, _, err := n.ov.Estimate()
	if err != nil {
		est = 0
	}
	rep, haveRep := n.reportedPopulation()
	return choosePopulation(est, rep, haveRep, n.ov.PeerCount())
}

// choosePopulation is population's rule, given the overlay's estimate (0:
// none), the median of peer reports (haveRep: there are enough) and the
// number of live peers the node knows.
func choosePopulation(est, rep float64, haveRep bool, known int) float64 {
	floor := float64(1 + known)
	switch {
	case est >= 1 && (!haveRep || (est >= rep/2 && est <= 2*rep)):
		return max(est, floor)
	case haveRep:
		return max(rep, floor)
	}
	return floor
}

// minReports is how many peer reports reportedPopulation needs.
const minReports = 3

// notePeerEstimate records a population estimate a peer reported in a
// step query or reply. Nonsense is ignored.
func (n *Node) notePeerEstimate(est float64) {
	if !(est >= 1) || est > 1e9 {
		return
	}
	n.repMu.Lock()
	n.reports.add(est)
	n.repMu.Unlock()
}

// reportedPopulation is the median of the last peer reports of the
// population (up to 32), if there are at least minReports. The median
// keeps a few lying peers from moving it.
func (n *Node) reportedPopulation() (float64, bool) {
	n.repMu.Lock()
	v := n.reports.values()
	n.repMu.Unlock()
	if len(v) < minReports {
		return 0, false
	}
	slices.Sort(v)
	return v[len(v)/2], true
}
