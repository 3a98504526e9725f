package barrier

import (
	"context"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/pspnode/pspnode/internal/lineage"
	"github.com/pspnode/pspnode/internal/wire"
	"github.com/pspnode/pspnode/overlay"
	"github.com/pspnode/pspnode/psp"
)

// Answer is a peer's reply to a step query, or why there is none.
type Answer struct {
	Reply wire.StepReply
	Err   error
}

// PeerAnswer is one peer's answer to a step query. Stopped: the query
// failed because the asker stopped, not the peer.
type PeerAnswer struct {
	Peer    peer.ID
	A       Answer
	Stopped bool
	Asked   int64 // the step the query said this node had
}

// ask queries peers in parallel; each query has its own deadline.
func (b *Barrier) Ask(ctx context.Context, peers []peer.ID) []Answer {
	out := make([]Answer, len(peers))
	req := wire.StepRequest{Step: b.step.Load(), Estimate: b.pop.Estimate()}
	var wg sync.WaitGroup
	for i, p := range peers {
		wg.Go(func() {
			r, err := b.Query(ctx, p, req)
			out[i] = Answer{r, err}
		})
	}
	wg.Wait()
	return out
}

// evidence is what a barrier check's answers told of the peers' liveness
// and of the population, gathered for one overlay call (Overlay.Note) and
// one update of the peers heard from (isolation.go) when the check ends,
// rather than a call per answer.
type evidence struct {
	dead, alive []peer.ID
	estimates   []overlay.Estimate
}

// failed takes a step query that failed while the node runs: the peer is
// dead.
func (b *Barrier) failed(p peer.ID, ev *evidence) {
	b.m.Timeouts.Inc()
	b.forgetPeer(p, ev)
}

// forgetPeer forgets a peer that left or failed: its known step and idle
// stream go now, and the overlay holds it dead once the check ends.
func (b *Barrier) forgetPeer(p peer.ID, ev *evidence) {
	b.progress.Forget(p)
	b.paces.forget(p)
	b.asker.Drop(p)
	b.kin.ForgetLineage(p)
	ev.dead = append(ev.dead, p)
}

// note hands the evidence to the overlay and the isolation record.
func (b *Barrier) note(ev *evidence) {
	b.ov.Note(ev.dead, ev.alive, ev.estimates)
	if len(ev.dead) > 0 {
		b.pop.Repopulate() // fewer live peers: the population's floor and count
	}
	b.iso.NoteHeard(ev.alive...)
	*ev = evidence{}
}

// judge turns one answer into an observation, or says that it does not
// count: a leaving peer is dropped, a peer of another model or lineage
// is no observation, and a report the screen refuses does not count. Only
// the barrier's goroutine calls judge (b.screen is not safe for
// concurrent use).
func (b *Barrier) judge(p peer.ID, r wire.StepReply, asked int64, ev *evidence) (psp.Observation, bool) {
	if r.Leaving {
		b.iso.NoteLeft(p)
		b.forgetPeer(p, ev)
		return psp.Observation{}, false
	}
	switch b.kin.Admit(p, r.Ext, false) { // genesis.go
	case lineage.OtherModel: // held out: not of this job, so no sign of its life either (isolation.go)
		b.iso.Forget(p)
		return psp.Observation{}, false
	case lineage.OtherFork: // alive, but its step is another lineage's
		ev.alive = append(ev.alive, p)
		b.progress.Forget(p) // and what it showed on this one no longer holds
		return psp.Observation{}, false
	}
	ev.alive = append(ev.alive, p)
	b.boot.FirstPeer()
	if r.Estimate > 0 {
		ev.estimates = append(ev.estimates, overlay.Estimate{Peer: p, N: r.Estimate})
		b.pop.NotePeerEstimate(r.Estimate)
	}
	// Hold the peer to its earlier reports (psp.Screen). A stuck peer
	// that is not behind us cannot hold us back, so it still counts.
	v := psp.Accept
	if b.screen != nil {
		v = b.screen.Check(string(p), r.Step, time.Since(b.started).Seconds(), b.StepInterval())
	}
	if v == psp.Stuck && r.Step >= b.step.Load() {
		v = psp.Accept
	}
	if v != psp.Accept {
		b.m.Screened.WithLabelValues(v.String()).Inc()
		if v != psp.Stuck { // it went backwards: no answer of its counts unasked for a while
			b.progress.Distrust(p, time.Now().Add(dur(b.cfg.Screen.Quarantine)))
		}
		return psp.Observation{}, false
	}
	b.progress.Vouch(p, r.Step, time.Now())
	b.Promised(p, r, asked)
	return psp.Observation{Peer: string(p), Step: r.Step, Interval: r.Interval}, true
}

// drain takes in the k answers still to come on results after a check
// that stopped waiting for them: what they tell of their peers' steps and
// liveness still counts (a peer seen at a step is not asked again at the
// next check; one that never answers is found dead at its query's
// deadline and leaves the sampler), but not at a barrier, so the screen
// is not consulted. The overlay hears of them in one call at the end.
func (b *Barrier) Drain(results <-chan PeerAnswer, k int) {
	var ev evidence
	for range k {
		r := <-results // every query sends, within its deadline
		switch {
		case r.A.Err != nil:
			if !r.Stopped {
				b.failed(r.Peer, &ev)
			}
		case r.A.Reply.Leaving:
			b.iso.NoteLeft(r.Peer)
			b.forgetPeer(r.Peer, &ev)
		default:
			// Not quiet: the peer may never be heard from again (a
			// joiner that learns of the mismatch from this query exits).
			switch b.kin.Admit(r.Peer, r.A.Reply.Ext, false) { // genesis.go
			case lineage.OtherModel: // held out
				b.iso.Forget(r.Peer)
				continue
			case lineage.OtherFork: // alive, but its step is another lineage's
				ev.alive = append(ev.alive, r.Peer)
				b.progress.Forget(r.Peer)
				continue
			}
			ev.alive = append(ev.alive, r.Peer)
			b.progress.Vouch(r.Peer, r.A.Reply.Step, time.Now())
			b.Promised(r.Peer, r.A.Reply, r.Asked)
		}
	}
	b.note(&ev)
}
