package node

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/pspnode/pspnode/node/status"
)

// Resets: a node that realigns (realign.go) replaces its step and model,
// and a driven node its trainer's, with the job's. Each one costs the
// trainer its own work since, so resets are held to resetBurst, and one
// more per resetEvery after: a lineage change lineage.Decide allows or a
// wedge psp.Wedge finds, and no more often than that. Each is counted
// (psp_resets_total{reason}); one refused for the rate is counted too
// (psp_resets_refused_total), and said at most once per resetLogEvery, with
// how many were refused since the last time it was said.
const (
	resetBurst    = 3
	resetEvery    = 2 * time.Minute
	resetLogEvery = 10 * time.Second
)

// Reasons a node reset its step and model (psp_resets_total's label).
const (
	resetLineage = status.ResetLineage // it converged on the job's lineage
	resetWedged  = status.ResetWedged  // it was far ahead of every peer it asked
)

// resetGate is the resets' token bucket and the refusals' log rate. The
// zero value is full.
type resetGate struct {
	m    *status.Metrics
	log  *slog.Logger
	life context.Context // the node's: its logs carry it

	mu      sync.Mutex
	used    float64   // tokens spent, at at; the bucket holds resetBurst − used
	at      time.Time // when used was last brought up to date
	logAt   time.Time // when a refusal was last said
	unsaid  int       // refusals since
	refused int       // all refusals (for tests)
}

// refill brings used up to now. g.mu is held.
func (g *resetGate) refill(now time.Time) {
	if !g.at.IsZero() {
		g.used = max(0, g.used-float64(now.Sub(g.at))/float64(resetEvery))
	}
	g.at = now
}

// allows reports whether a reset may happen at now.
func (g *resetGate) allows(now time.Time) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.refill(now)
	return g.used+1 <= resetBurst
}

// take spends a reset at now.
func (g *resetGate) take(now time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.refill(now)
	g.used++
}

// refuse notes a refused reset and reports whether to say so now, and how
// many refusals the saying covers.
func (g *resetGate) refuse(now time.Time) (say bool, count int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.refused++
	g.unsaid++
	if !g.logAt.IsZero() && now.Sub(g.logAt) < resetLogEvery {
		return false, 0
	}
	count, g.unsaid, g.logAt = g.unsaid, 0, now
	return true, count
}

// allowed reports whether the node may reset its step and model now
// for why (resetLineage, resetWedged); if not, it counts and (at a bounded
// rate) says the refusal.
func (g *resetGate) allowed(why string) bool {
	now := time.Now()
	if g.allows(now) {
		return true
	}
	g.m.ResetsRefused.Inc()
	if say, count := g.refuse(now); say {
		g.log.Log(g.life, slog.LevelWarn, "not resetting to the job's step and model: this node reset too often lately (a peer group that keeps claiming another lineage, or a node that keeps finding itself far ahead)",
			"reason", why, "refused", count, "at_most", resetBurst, "then_one_per", resetEvery)
	}
	return false
}

// done counts a reset for why.
func (g *resetGate) done(why string) {
	g.take(time.Now())
	g.m.Resets.WithLabelValues(why).Inc()
}
