package node

import (
	"math"
	"sync"
	"time"

	"github.com/pspnode/pspnode/node/status"
	"github.com/pspnode/pspnode/overlay"
	"github.com/pspnode/pspnode/psp"
)

// census is the node's population estimate: its own estimators' guess
// (estimate) and the population its peers' reports and its own make
// (population), each cached for a moment. It reads the overlay and the
// time of the last leave (isolation.go) and nothing else of the node.
type census struct {
	ov        *overlay.Overlay // set once the overlay is up, before any read
	started   time.Time
	window    time.Duration // Overlay.EstimateWindow
	reportAge time.Duration // Overlay.ReportMaxAge
	m         *status.Metrics
	lastLeave func() time.Time

	estMu  sync.Mutex // guards estAt and estVal
	estAt  time.Time
	estVal float64
	// popMu guards population's cache: popVal, computed at popAt.
	popMu  sync.Mutex
	popVal float64
	popAt  time.Time
}

// estimate is the population estimate this node reports to peers: its own
// local estimate (zone density and lookups), not the fused one, so that the
// reports a node averages stay independent and errors do not echo; or the
// exact count of a small job that just lost a peer; 0 while the
// estimators have nothing. It is recomputed at most once a second: every
// query a node sends or answers carries it.
func (c *census) Estimate() float64 {
	c.estMu.Lock()
	defer c.estMu.Unlock()
	if time.Since(c.estAt) < time.Second {
		return c.estVal
	}
	est, _, err := c.ov.LocalEstimate()
	if err != nil || math.IsNaN(est) || math.IsInf(est, 0) || est < 0 {
		est = 0
	}
	if c.exactCount() { // a small job that just lost a peer
		est = float64(1 + c.ov.PeerCount())
	}
	c.estAt, c.estVal = time.Now(), est
	return est
}

// population is the node's best guess of the number of nodes
// (psp.Population): the weighted lower median of its own estimate
// (estimate: its overlay's zone and lookup estimators, or the exact count
// of a small job that just lost a peer) and its peers' latest reports,
// each peer one vote weighed by how long the node has known it, never
// fewer than itself plus the live peers it knows. Once the node has run
// for popSettle it changes no faster than psp.BoundRate allows. It is
// computed at most once per popTTL.
//
// It sets the learning rate (Config.ScaleLR), and through it the size of
// the node's updates, which its peers hold to the norm bound, so nodes
// should agree on it. The floor makes a small job agree exactly: in a job
// of four, estimates of 3 (and peer reports of 2) beside others' 4 made
// some updates more than 4 times the median of others' own. A joiner's
// overlay knows only its bootstrap peers at its first step and estimates a
// population of about 4: it scaled its rate by 1/4 where its peers used
// 1/50, and every peer refused its first update, a dozen times the size
// of theirs (148 of 151 norm refusals in a 50-node testnet with churn).
// Its own estimate weighs as a new reporter's, so the reports of the
// peers it asked at its join carry it (join.go drops the cached guess).
//
// Reports are claims. Two liars reporting 1e9 beside three honest nodes
// moved every node to 5e8 when the guess was the median of the reports
// alone (the mean of 3 and 1e9), and a node then preferred that median to
// its own estimate, more than twice off; a minority of the weight cannot
// move a lower median with the node's own vote in it beyond the others'.
//
// A node alone counts itself: 1. And in a small job, the count is exact
// for a while after a peer leaves (exactCount).
func (c *census) Population() float64 {
	now := time.Now()
	c.popMu.Lock()
	defer c.popMu.Unlock()
	if !c.popAt.IsZero() && now.Sub(c.popAt) < popTTL {
		return c.popVal
	}
	known := c.ov.PeerCount()
	v := float64(1 + known)
	if !c.exactCount() {
		reps := c.ov.PeerReports()
		rs := make([]psp.Report, len(reps))
		for i, r := range reps {
			rs[i] = psp.Report{N: r.N, Age: r.For.Seconds()}
		}
		age := now.Sub(c.started)
		v = psp.Population(c.Estimate(), rs, known, age.Seconds())
		if age >= popSettle && !c.popAt.IsZero() {
			v = max(psp.BoundRate(c.popVal, v, now.Sub(c.popAt).Seconds()), float64(1+known))
		}
	}
	c.popAt, c.popVal = now, v
	return v
}

const (
	// popTTL is how long a computed population is reused: barriers,
	// steps and /status read it, and each computation weighs every
	// peer's report.
	popTTL = time.Second
	// popSettle is how long a node runs before its population changes no
	// faster than psp.BoundRate: a joiner's first guesses climb from its
	// bootstrap peers to the job's at once.
	popSettle = 30 * time.Second
)

// repopulate drops the cached population, so that the next reads the
// reports that just came (a joiner's, from its first peers).
func (c *census) Repopulate() {
	c.popMu.Lock()
	c.popAt = time.Time{}
	c.popMu.Unlock()
}

// Population is the node's best guess of the number of nodes in its job,
// as its learning rate uses it and /status reports it (population_estimate).
func (n *Node) Population() float64 { return n.pop.Population() }

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
func (c *census) exactCount() bool {
	left := c.lastLeave()
	if left.IsZero() {
		return false
	}
	memory := max(c.window, c.reportAge)
	if time.Since(left) > memory {
		return false
	}
	return c.ov.EstimateDetail().ZoneDepth == 0
}

// notePeerEstimate judges a population estimate a peer reported in a step
// query or reply, which the caller has given the overlay
// (Overlay.ObserveEstimate keeps each peer's latest): nonsense, or a report
// more than overlay.ReportBand times off the node's population, counts as
// a hostile message (population_outlier). It moves nothing either way:
// each peer is one vote of psp.Population's, and the overlay's estimate
// leaves such reports out.
//
// (The node kept the last 32 reports it heard, whoever sent them: one peer
// sending twenty queries a second reporting 1e9 filled them, and moved
// every node of a job of three from 3 to 1e9 within ten seconds.)
func (c *census) NotePeerEstimate(est float64) {
	if !(est >= 1) || est > 1e9 {
		c.m.Hostile.WithLabelValues(status.KindPopulationOutlier).Inc()
		return
	}
	if pop := c.Population(); est > pop*overlay.ReportBand || est < pop/overlay.ReportBand {
		c.m.Hostile.WithLabelValues(status.KindPopulationOutlier).Inc()
	}
}
