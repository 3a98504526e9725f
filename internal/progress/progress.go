// Package progress is what a node knows of its peers' steps without
// asking them, and whom it should tell when it advances (Table). Package
// node feeds it from the step protocol's messages and the updates it
// takes in, and reads it at every barrier check (psp.Checker's Known and
// DrawnKnown); see Table for how that spares most of a check's queries.
package progress

import (
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/pspnode/pspnode/psp"
)

// Table is what a node knows of its peers' steps without asking, and
// whom it should tell when it advances. It makes two barrier costs the
// simulator does not have mostly disappear:
//
//   - A global barrier (BSP, SSP) must hear from every known peer. Steps
//     only grow, so a peer seen at or above this check's threshold (from a
//     reply, a query it sent us, or an update it published) cannot be
//     lagging, and is not asked again. Only the peers that may still lag
//     are queried: usually a handful, not N−1.
//   - A sampled barrier (pBSP, pSSP) draws β peers a check, and a waiting
//     node has heard many of those it draws answer at or above the
//     check's threshold (most checks end at their first answer behind,
//     and the other answers still come in). Those count without asking
//     too, but only on steps the peer gave in answer to this node's own
//     queries, or carried in an update or model of that step that this
//     node took in (vouch: the peer made that step, and this node holds
//     its work), and not while the node's screen holds the peer's reports
//     refused (distrust: it went backwards). A step a peer claims in a
//     query of its own is no answer, and counts for the global barriers
//     only, as before. So where peers push their updates to this node
//     every step (gossip, or epidemic with S at least the job's size),
//     a check on a long link usually passes with no round trip at all.
//   - A peer known to be below a check's threshold (a drawn one, for a
//     sampled barrier) fails it without asking, under every static
//     barrier (promise): its last answer was below, and it
//     promised a progress notice (below) when it reaches that threshold,
//     so until a notice or any later sign of a higher step comes, its
//     answer would still be behind. The promise is held for at most
//     PromiseSteps of this node's mean compute time per step and half the
//     answerer's waiter lifetime, so a notice lost costs a few steps'
//     knowledge, never a stuck barrier.
//   - A waiting node learns of progress when a peer it waits for advances.
//     A node asked by a peer that its step was holding back (the asker's
//     barrier threshold is above this node's step) notes the asker as a
//     waiter; when this node's step reaches that threshold it sends the
//     waiter a step query, which wakes the waiter's barrier at once
//     instead of at its next poll.
//
// Safe for concurrent use (stream handlers and the Run goroutine).
type Table struct {
	mu      sync.Mutex
	seen    map[peer.ID]seenStep // the highest steps each peer has shown
	waiters map[peer.ID]waiter   // peers this node was holding back
}

// seenStep is the highest step a peer has shown, and the highest it gave
// in answer to this node's queries (-1: none); until, if set, is when the
// node's screen stops refusing its reports (no answer is vouched for
// before then). below > 0 is a promise: the peer answered below it and
// will send a progress notice on reaching it, so its step is below it
// until then, or until belowBy (Unix nanoseconds) at the latest.
type seenStep struct {
	any, vouched int64
	below        int64
	belowBy      int64
	until        time.Time
}

type waiter struct {
	threshold int64     // the waiter passes once this node's step reaches this
	at        time.Time // when it asked
}

const (
	maxSeen    = 8192    // peers remembered; beyond, the map is reset
	maxWaiters = maxSeen // waiters remembered at once (all are told: BSP waits on the last node)
	// WaiterTTL: a waiter not released by then is forgotten.
	WaiterTTL = 30 * time.Second

	// PromiseSteps bounds how long an answerer's promise of a progress
	// notice is held, in the asker's mean step times (and never beyond
	// half WaiterTTL): a behind peer usually reaches the threshold
	// within a step, so a longer wait means its notice was lost.
	PromiseSteps = 4
)

// New is an empty table.
func New() *Table {
	return &Table{seen: make(map[peer.ID]seenStep), waiters: make(map[peer.ID]waiter)}
}

// Saw records that p has reached step.
func (g *Table) Saw(p peer.ID, step int64) { g.record(p, step, time.Time{}) }

// Vouch records that p has reached step, by its answer to a query of this
// node's (at now).
func (g *Table) Vouch(p peer.ID, step int64, now time.Time) { g.record(p, step, now) }

// Distrust stops vouching for p until until: the node's screen refused its
// report (it went backwards, so its answers are not held to be steps).
func (g *Table) Distrust(p peer.ID, until time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	s, ok := g.seen[p]
	if !ok {
		s.any = -1
	}
	s.vouched, s.until = -1, until
	s.below, s.belowBy = 0, 0
	g.seen[p] = s
}

// Promise records that p, in answer to this node's query at now, was
// below below and promised a progress notice on reaching it; the promise
// holds until by at the latest. An answer the screen refuses makes no
// promise, nor one at or under a step p is known to have reached.
func (g *Table) Promise(p peer.ID, below int64, now, by time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	s, ok := g.seen[p]
	if !ok || now.Before(s.until) || s.any >= below || !by.After(now) {
		return
	}
	// An answer to an older query can arrive after a newer one: the
	// answerer keeps its waiter at the highest threshold asked.
	s.below, s.belowBy = max(s.below, below), max(s.belowBy, by.UnixNano())
	g.seen[p] = s
}

// record is Saw (now zero) and Vouch.
func (g *Table) record(p peer.ID, step int64, now time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	old, ok := g.seen[p]
	if !ok {
		old = seenStep{any: -1, vouched: -1}
	}
	s := old
	s.any = max(old.any, step)
	if !now.IsZero() && !now.Before(s.until) {
		s.vouched = max(old.vouched, step)
	}
	if s.any >= s.below {
		s.below, s.belowBy = 0, 0 // it reached the promised step: the promise is kept
	}
	if s == old {
		return
	}
	if !ok && len(g.seen) >= maxSeen {
		clear(g.seen) // rare (a very large or very churny job); it refills from replies
	}
	g.seen[p] = s
}

// Forget drops what is known of p (it left or failed), but for a distrust
// still running.
func (g *Table) Forget(p peer.ID) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if s, ok := g.seen[p]; ok && !s.until.IsZero() {
		g.seen[p] = seenStep{any: -1, vouched: -1, until: s.until}
	} else {
		delete(g.seen, p)
	}
	delete(g.waiters, p)
}

// Reset forgets every peer's step and every waiter (the node moved onto
// another lineage of the job, whose steps these are not).
func (g *Table) Reset() {
	g.mu.Lock()
	defer g.mu.Unlock()
	clear(g.seen)
	clear(g.waiters)
}

// AtLeast reports whether p is known to have reached step.
func (g *Table) AtLeast(p peer.ID, step int64) (int64, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	s, ok := g.seen[p]
	return s.any, ok && s.any >= 0 && s.any >= step
}

// Known returns the highest step p has shown, if any.
func (g *Table) Known(p peer.ID) (int64, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	s, ok := g.seen[p]
	return s.any, ok && s.any >= 0
}

// KnownAll is known for each of peers, with the promise of a notice it
// holds at now, under one lock, as a global barrier check takes them
// (psp.Checker.Known).
func (g *Table) KnownAll(peers []peer.ID, now time.Time) []psp.Known {
	return g.all(peers, now, func(s seenStep) int64 { return s.any })
}

// VouchedAll is, for each of peers, the highest step the node's screen
// passed, and the promise of a notice it holds at now, under one lock, as
// a sampled barrier check takes them (psp.Checker.DrawnKnown).
func (g *Table) VouchedAll(peers []peer.ID, now time.Time) []psp.Known {
	return g.all(peers, now, func(s seenStep) int64 { return s.vouched })
}

// all is, for each of peers, the step step picks of what is known of it
// (seen if it is not −1), and the promise of a notice held at now.
func (g *Table) all(peers []peer.ID, now time.Time, step func(seenStep) int64) []psp.Known {
	out := make([]psp.Known, len(peers))
	ns := now.UnixNano()
	g.mu.Lock()
	defer g.mu.Unlock()
	for i, p := range peers {
		out[i].Peer = string(p)
		s, ok := g.seen[p]
		if !ok {
			continue
		}
		if st := step(s); st >= 0 {
			out[i].Step, out[i].Seen = st, true
		}
		if s.below > 0 && ns < s.belowBy {
			out[i].Below = s.below
		}
	}
	return out
}

// Wait notes that p waits for this node's step to reach threshold.
func (g *Table) Wait(p peer.ID, threshold int64, now time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if w, ok := g.waiters[p]; ok {
		g.waiters[p] = waiter{max(w.threshold, threshold), now}
		return
	}
	if len(g.waiters) >= maxWaiters {
		return
	}
	g.waiters[p] = waiter{threshold, now}
}

// Release returns (and forgets) the waiters that this node's step now lets
// pass, and forgets waiters older than WaiterTTL.
func (g *Table) Release(step int64, now time.Time) []peer.ID {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []peer.ID
	for p, w := range g.waiters {
		switch {
		case now.Sub(w.at) > WaiterTTL:
			delete(g.waiters, p)
		case step >= w.threshold:
			out = append(out, p)
			delete(g.waiters, p)
		}
	}
	return out
}
