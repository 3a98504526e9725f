package node

import (
	"fmt"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
)

// Isolation. A barrier check passes only on what peers say, so a check
// that hears from no peer must not pass: a node cut off from all its peers
// (its own link down, a firewall, a partition of one) would otherwise run
// on with no barrier at all, every query failing and every empty check
// passing. The policy (psp.Isolated applies it; progress.Heard keeps the
// peers heard from, this file the node's isolated state):
//
//   - A check that asked peers and got no answer from any of them (every
//     query failed or timed out) is isolated: it fails, and the node
//     re-checks, with a fresh sample, on its usual backoff.
//   - A check with no peer to ask (the node holds no peer live) is
//     isolated too while the node has heard from a peer lately (it
//     answered a step query or sent one) that has not said it leaves:
//     such a peer was found dead, by a failed query or a failed probe of
//     the overlay, and the overlay dials it again every RetryDead (15 s);
//     it comes back as soon as it answers.
//   - An answer of any kind (a step, a leaving flag, a report the screen
//     refuses), or a step query from a peer, ends it.
//   - A node that holds no peer live and has heard from none lately is
//     alone and trains: the first node of a job, or one whose peers have
//     all left (with a leave notice). "Lately" is 2 × Overlay.DeadHold
//     (4 min), as long as the overlay remembers a dead peer: after that, a
//     node whose every peer failed takes them for gone and trains alone.
//     ASP and β = 0 never check, so never isolate.
//
// While isolated, /status says "isolated": true (with isolated_since),
// /health answers 503, and psp_isolated is 1. A driven node sees the same
// through Driver.Barrier, which waits as Run does. (Its state is Node's
// heard, isoMu and isoSince.)

// noteHeard records that peers answered a step query or sent one.
func (n *Node) noteHeard(peers ...peer.ID) {
	for _, p := range n.heard.Note(time.Now(), n.heardHold(), peers...) {
		n.emit(PeerJoined, p)
	}
}

// noteLeft forgets p: it said it leaves, so its absence is no failure.
// The time of the departure goes to the population estimate, which is
// computed again at its next read.
func (n *Node) noteLeft(p peer.ID) {
	n.heard.Left(p, time.Now())
	n.repopulate()
	n.emit(PeerLeft, p)
}

// unheard forgets p without counting a departure: a peer held out for
// running another model (genesis.go).
func (n *Node) unheard(p peer.ID) { n.heard.Forget(p) }

// lastLeave is when a peer last said it leaves (zero: never).
func (n *Node) lastLeave() time.Time { return n.heard.LastLeave() }

// heardHold is how long a peer heard from counts: as long as the overlay
// holds a dead peer before forgetting it.
func (n *Node) heardHold() time.Duration { return 2 * n.cfg.Overlay.DeadHold }

// heardLately reports whether a peer that has not left was heard from
// within heardHold.
func (n *Node) heardLately(now time.Time) bool { return n.heard.Lately(now, n.heardHold()) }

// setIsolated records whether the node is isolated, as its last check
// found (psp.Isolated).
func (n *Node) setIsolated(on bool, now time.Time) {
	n.isoMu.Lock()
	was := !n.isoSince.IsZero()
	switch {
	case on && !was:
		n.isoSince = now
	case !on && was:
		n.isoSince = time.Time{}
	}
	since := n.isoSince
	n.isoMu.Unlock()
	switch {
	case on && !was:
		n.m.Isolated.Set(1)
		n.emit(Isolated, "")
		n.log.Warn("isolated: no peer of the job answers; not training until one does")
	case !on && was:
		n.m.Isolated.Set(0)
		n.emit(Reconnected, "")
		n.log.Info("no longer isolated: a peer answered", "isolated_for", now.Sub(since).Round(time.Millisecond))
	}
}

// isolatedSince returns when the node became isolated (zero: it is not).
func (n *Node) isolatedSince() time.Time {
	n.isoMu.Lock()
	defer n.isoMu.Unlock()
	return n.isoSince
}

// isolatedReason says why an isolated node waits, for /health and the
// Driver ("" when it is not isolated).
func (n *Node) isolatedReason() string {
	since := n.isolatedSince()
	if since.IsZero() {
		return ""
	}
	return fmt.Sprintf("isolated: no peer of job %s has answered a step query for %v; not training until one does",
		n.cfg.Job, time.Since(since).Round(time.Second))
}
