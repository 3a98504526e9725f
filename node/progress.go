package node

import (
	"context"
	"math"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/pspnode/pspnode/internal/wire"
	"github.com/pspnode/pspnode/psp"
)

// progress is what a node knows of its peers' steps without asking, and
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
//     promiseSteps of this node's mean compute time per step and half the
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
type progress struct {
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
	maxSeen    = 8192             // peers remembered; beyond, the map is reset
	maxWaiters = maxSeen          // waiters remembered at once (all are told: BSP waits on the last node)
	waiterTTL  = 30 * time.Second // a waiter not released by then is forgotten

	// promiseSteps bounds how long an answerer's promise of a progress
	// notice is held, in the asker's mean step times (and never beyond
	// half waiterTTL): a behind peer usually reaches the threshold
	// within a step, so a longer wait means its notice was lost.
	promiseSteps = 4
)

func newProgress() *progress {
	return &progress{seen: make(map[peer.ID]seenStep), waiters: make(map[peer.ID]waiter)}
}

// saw records that p has reached step.
func (g *progress) saw(p peer.ID, step int64) { g.record(p, step, time.Time{}) }

// vouch records that p has reached step, by its answer to a query of this
// node's (at now).
func (g *progress) vouch(p peer.ID, step int64, now time.Time) { g.record(p, step, now) }

// distrust stops vouching for p until until: the node's screen refused its
// report (it went backwards, so its answers are not held to be steps).
func (g *progress) distrust(p peer.ID, until time.Time) {
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

// promise records that p, in answer to this node's query at now, was
// below below and promised a progress notice on reaching it; the promise
// holds until by at the latest. An answer the screen refuses makes no
// promise, nor one at or under a step p is known to have reached.
func (g *progress) promise(p peer.ID, below int64, now, by time.Time) {
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

// record is saw (now zero) and vouch.
func (g *progress) record(p peer.ID, step int64, now time.Time) {
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

// forget drops what is known of p (it left or failed), but for a distrust
// still running.
func (g *progress) forget(p peer.ID) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if s, ok := g.seen[p]; ok && !s.until.IsZero() {
		g.seen[p] = seenStep{any: -1, vouched: -1, until: s.until}
	} else {
		delete(g.seen, p)
	}
	delete(g.waiters, p)
}

// reset forgets every peer's step and every waiter (the node moved onto
// another lineage of the job, whose steps these are not).
func (g *progress) reset() {
	g.mu.Lock()
	defer g.mu.Unlock()
	clear(g.seen)
	clear(g.waiters)
}

// atLeast reports whether p is known to have reached step.
func (g *progress) atLeast(p peer.ID, step int64) (int64, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	s, ok := g.seen[p]
	return s.any, ok && s.any >= 0 && s.any >= step
}

// known returns the highest step p has shown, if any.
func (g *progress) known(p peer.ID) (int64, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	s, ok := g.seen[p]
	return s.any, ok && s.any >= 0
}

// knownAll is known for each of peers, with the promise of a notice it
// holds at now, under one lock, as a global barrier check takes them
// (psp.Checker.Known).
func (g *progress) knownAll(peers []peer.ID, now time.Time) []psp.Known {
	return g.all(peers, now, func(s seenStep) int64 { return s.any })
}

// vouchedAll is, for each of peers, the highest step the node's screen
// passed, and the promise of a notice it holds at now, under one lock, as
// a sampled barrier check takes them (psp.Checker.DrawnKnown).
func (g *progress) vouchedAll(peers []peer.ID, now time.Time) []psp.Known {
	return g.all(peers, now, func(s seenStep) int64 { return s.vouched })
}

// all is, for each of peers, the step step picks of what is known of it
// (seen if it is not −1), and the promise of a notice held at now.
func (g *progress) all(peers []peer.ID, now time.Time, step func(seenStep) int64) []psp.Known {
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

// wait notes that p waits for this node's step to reach threshold.
func (g *progress) wait(p peer.ID, threshold int64, now time.Time) {
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

// release returns (and forgets) the waiters that this node's step now lets
// pass, and forgets waiters older than waiterTTL.
func (g *progress) release(step int64, now time.Time) []peer.ID {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []peer.ID
	for p, w := range g.waiters {
		switch {
		case now.Sub(w.at) > waiterTTL:
			delete(g.waiters, p)
		case step >= w.threshold:
			out = append(out, p)
			delete(g.waiters, p)
		}
	}
	return out
}

// noteAsker records what a step query tells about its sender: its step,
// and, if this node's step holds back the sender's barrier, that it waits.
func (n *Node) noteAsker(from peer.ID, step int64) {
	n.progress.saw(from, step)
	s := n.cfg.Barrier.BaseStaleness()
	if s < 0 {
		return // ASP never waits
	}
	if threshold := step - int64(s); n.step.Load() < threshold {
		n.progress.wait(from, threshold, time.Now())
	}
}

// promised records the notice an answer promised: a reply below the
// request's step less the answerer's staleness bound, from an answerer
// that sends notices (the 1.1.0 notices field), holds the peer below that
// threshold until it says otherwise, for at most promiseSteps of this
// node's mean compute time (none before it has one) and half waiterTTL.
func (n *Node) promised(p peer.ID, r wire.StepReply, asked int64) {
	if r.Ext == nil || !r.Ext.Notices {
		return
	}
	below := asked - int64(r.Ext.Staleness)
	if below <= 0 || r.Step >= below {
		return
	}
	hold := min(waiterTTL/2, dur(promiseSteps*math.Float64frombits(n.compute.Load())))
	if hold <= 0 {
		return
	}
	now := time.Now()
	n.progress.promise(p, below, now, now.Add(hold))
}

// pushProgress tells the waiters this node's new step releases that it
// advanced: a step query each, whose arrival wakes their barrier. Each
// query ends within QueryTimeout or when ctx ends; nobody waits for them.
func (n *Node) pushProgress(ctx context.Context, step int64) {
	peers := n.progress.release(step, time.Now())
	if len(peers) == 0 {
		return
	}
	n.m.pushed.Add(float64(len(peers)))
	req := wire.StepRequest{Step: step, Estimate: n.estimate()}
	for _, p := range peers {
		go func() { // ends within QueryTimeout, or when the node stops
			r, err := n.queryStep(ctx, p, req)
			switch {
			case err != nil && ctx.Err() == nil:
				n.queryFailed(p)
			case err == nil && !r.Leaving:
				n.progress.saw(p, r.Step)
			}
		}()
	}
}

// dropPeer forgets a peer that left or failed: the overlay holds it dead
// (out of samples and the known population) and its known step goes.
func (n *Node) dropPeer(p peer.ID) {
	n.ov.MarkDead(p)
	n.progress.forget(p)
	n.asker.Drop(p)
}

// queryFailed handles a step query that failed while the node runs.
func (n *Node) queryFailed(p peer.ID) {
	n.m.timeouts.Inc()
	n.dropPeer(p)
}
