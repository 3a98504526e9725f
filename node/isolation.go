package node

import (
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/pspnode/pspnode/internal/progress"
	"github.com/pspnode/pspnode/node/status"
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
// through Driver.Barrier, which waits as Run does. (Its state is the
// node's isolation.)

// isolation is the peers heard from lately and the node's isolated state.
// It tells the node's events and the population what it learns through
// its two hooks, and nothing else of the node.
type isolation struct {
	heard progress.Heard
	hold  time.Duration // how long a peer counts as heard: twice Overlay.DeadHold
	job   string
	m     *status.Metrics
	log   *slog.Logger
	emit  func(EventKind, peer.ID)
	left  func() // a peer left: the population's count changed

	mu    sync.Mutex
	since time.Time // when the node became isolated; zero while it is not
}

// noteHeard records that peers answered or asked: the node is not cut off.
func (iso *isolation) NoteHeard(peers ...peer.ID) {
	for _, p := range iso.heard.Note(time.Now(), iso.hold, peers...) {
		iso.emit(PeerJoined, p)
	}
}

// noteLeft records that p said it leaves.
func (iso *isolation) NoteLeft(p peer.ID) {
	iso.heard.Left(p, time.Now())
	iso.left()
	iso.emit(PeerLeft, p)
}

// forget drops p from the peers heard from: it was of another job.
func (iso *isolation) Forget(p peer.ID) { iso.heard.Forget(p) }

// lastLeave is when a peer last said it leaves (zero: never).
func (iso *isolation) lastLeave() time.Time { return iso.heard.LastLeave() }

// lately reports whether any peer was heard from within the hold.
func (iso *isolation) Lately(now time.Time) bool { return iso.heard.Lately(now, iso.hold) }

// set records whether the last check was isolated, and tells the change.
func (iso *isolation) Set(on bool, now time.Time) {
	iso.mu.Lock()
	was := !iso.since.IsZero()
	switch {
	case on && !was:
		iso.since = now
	case !on && was:
		iso.since = time.Time{}
	}
	since := iso.since
	iso.mu.Unlock()
	switch {
	case on && !was:
		iso.m.Isolated.Set(1)
		iso.emit(Isolated, "")
		iso.log.Warn("isolated: no peer of the job answers; not training until one does")
	case !on && was:
		iso.m.Isolated.Set(0)
		iso.emit(Reconnected, "")
		iso.log.Info("no longer isolated: a peer answered", "isolated_for", now.Sub(since).Round(time.Millisecond))
	}
}

// isolatedSince is when the node became isolated; zero while it is not.
func (iso *isolation) isolatedSince() time.Time {
	iso.mu.Lock()
	defer iso.mu.Unlock()
	return iso.since
}

// reason is why the node does not train while isolated ("" while it is not).
func (iso *isolation) reason() string {
	since := iso.isolatedSince()
	if since.IsZero() {
		return ""
	}
	return fmt.Sprintf("isolated: no peer of job %s has answered a step query for %v; not training until one does",
		iso.job, time.Since(since).Round(time.Second))
}
