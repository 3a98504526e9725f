package node

import (
	"time"

	"github.com/pspnode/pspnode/node/status"
	"github.com/pspnode/pspnode/overlay"
	"github.com/pspnode/pspnode/psp"
)

// population is the node's best guess of the number of nodes: the overlay's
// estimate, unless it is off by more than a factor of two from the median
// of the estimates peers reported lately, one vote per peer
// (reportedPopulation), which then wins; without an overlay estimate, that
// median; and never fewer than itself plus the live peers it knows.
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
	return psp.Population(est, rep, haveRep, known)
}

// Population is the node's best guess of the number of nodes in its job,
// as its learning rate uses it and /status reports it (population_estimate).
func (n *Node) Population() float64 { return n.population() }

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

// notePeerEstimate judges a population estimate a peer reported in a step
// query or reply, which the caller has given the overlay
// (Overlay.ObserveEstimate keeps each peer's latest): nonsense, or a report
// more than overlay.ReportBand times off the median of every peer's latest
// one, counts as a hostile message (population_outlier). It moves nothing
// either way: the median is one vote per peer (reportedPopulation), and
// the overlay's estimate leaves such reports out.
//
// (The node kept the last 32 reports it heard, whoever sent them: one peer
// sending twenty queries a second reporting 1e9 filled them, and moved
// every node of a job of three from 3 to 1e9 within ten seconds.)
func (n *Node) notePeerEstimate(est float64) {
	if !(est >= 1) || est > 1e9 {
		n.m.Hostile.WithLabelValues(status.KindPopulationOutlier).Inc()
		return
	}
	med, ok := n.reportedMedian()
	if ok && (est > med*overlay.ReportBand || est < med/overlay.ReportBand) {
		n.m.Hostile.WithLabelValues(status.KindPopulationOutlier).Inc()
	}
}

// reportedMedianTTL is how long notePeerEstimate reuses a median: reports
// arrive with every step query and reply, and the median sorts every
// peer's.
const reportedMedianTTL = time.Second

// reportedMedian is reportedPopulation, computed at most once per
// reportedMedianTTL.
func (n *Node) reportedMedian() (float64, bool) {
	n.repMu.Lock()
	defer n.repMu.Unlock()
	if now := time.Now(); now.Sub(n.repAt) >= reportedMedianTTL {
		n.repMed, n.repOK = n.reportedPopulation()
		n.repAt = now
	}
	return n.repMed, n.repOK
}

// reportedPopulation is the median of the population estimates peers
// reported lately, one vote per peer (Overlay.ReportedMedian), if enough
// peers reported (psp.ReportQuorum). One peer, however often it reports, is
// one vote: the median moves only once liars are half the peers heard
// from.
func (n *Node) reportedPopulation() (float64, bool) {
	med, k := n.ov.ReportedMedian()
	if k < psp.ReportQuorum(n.ov.PeerCount()) {
		return 0, false
	}
	return med, true
}
