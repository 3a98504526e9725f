package node

import (
	"slices"
	"time"
)

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
//
// A node alone counts itself: 1. And in a small job, the count is exact
// for a while after a peer leaves (exactCount).
func (n *Node) population() float64 {
	known := n.ov.PeerCount()
	if n.exactCount() {
		return float64(1 + known)
	}
	est, _, err := n.ov.Estimate()
	if err != nil {
		est = 0
	}
	rep, haveRep := n.reportedPopulation()
	return choosePopulation(est, rep, haveRep, known)
}

// exactCount reports whether the node should count its job as itself and
// the live peers it knows, whatever the estimators say: in a small job
// (the zone estimator's depth is 0: no routing-table bucket is full, so
// the node knows every peer first-hand) when a peer said it leaves within
// the estimators' memory (the lookup window, the age of peer reports).
// The node drops a leaver from its live peers at once, but its lookups of
// the last 45 s and its peers' reports of the last 30 s were made while
// the leaver was there: a job of five that lost one still read 4.4 ten
// seconds later. In a large job one node is noise, and the estimators
// follow departures through their windows as before.
func (n *Node) exactCount() bool {
	left := n.lastLeave()
	if left.IsZero() {
		return false
	}
	memory := max(n.cfg.Overlay.EstimateWindow, n.cfg.Overlay.ReportMaxAge)
	if time.Since(left) > memory {
		return false
	}
	return n.ov.EstimateDetail().ZoneDepth == 0
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
