package node

import (
	"context"
	"errors"
	"math"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/pspnode/pspnode/internal/wire"
	"github.com/pspnode/pspnode/overlay"
	"github.com/pspnode/pspnode/psp"
)

// The barrier is psp.Checker's policy (what to ask, hedging, early exit,
// what a failed query or a silent check means, when to check again) with
// this file's I/O around it: draws from the overlay's sampler, step
// queries (steps.go), timers and the wake of progress reports
// (progress.go). Judging an answer (leaving peers, other lineages, the
// screen) is in observe.go. What a check learns of its peers' liveness
// goes to the overlay in one call when the check ends.

// barrierOutcome is what one pass of the barrier took: the checks, the
// time, and the last check that failed (its decision and how many peers
// it observed), if any did.
type barrierOutcome struct {
	Checks   int
	Waited   time.Duration
	Failed   psp.Decision // the last failed check's decision; Lagging 0 if none failed
	Observed int          // how many peers that check observed
	Isolated bool         // that check heard from no peer (psp.Isolated)
	// Realigned: the node took the job's step and model instead of
	// passing (realign.go); its step is not the one the barrier began at.
	Realigned bool
}

// barrier blocks until the barrier lets the node start its next step. The
// timing and population it works with are taken once, at its start.
//
// It returns ErrClosed as soon as the node leaves or shuts down. (It does
// not end ctx when it returns: a query of its last check runs on, to its
// own deadline, under ctx.)
func (n *Node) barrier(ctx context.Context) (barrierOutcome, error) {
	out, err := n.drive(ctx, n.checker, false)
	n.setWaiting(false)
	if err == nil {
		n.m.ObserveWait(out.Waited.Seconds())
	}
	return out, err
}

// observe runs one barrier check, with a Checker of its own, and returns
// what it observed (tests and benchmarks).
func (n *Node) observe(ctx context.Context) []psp.Observation {
	ck := psp.NewChecker(checkConfig(n.cfg), nil)
	_, _ = n.drive(ctx, ck, true)
	return ck.Observations()
}

// drive runs the barrier's checks, as ck's policy says, until one passes
// (or, once, until the first ends): it carries out what ck.Ready says
// (draws from the overlay, step queries, a timer for ck's wake time) and
// hands ck the answers, the timer's ticks and the progress reports that
// wake the node. Each check's queries send their answers to a channel of
// its own; those the check no longer needs run on to their own deadline,
// and what they tell still counts (drain).
func (n *Node) drive(ctx context.Context, ck *psp.Checker, once bool) (barrierOutcome, error) {
	start := time.Now()
	var out barrierOutcome
	req := n.startBarrier(ck)
	timeout := dur(ck.Timing().Timeout)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var run *checkRun // the check in progress; nil between checks
	defer func() { n.endRun(run) }()
	for {
		rd := ck.Ready()
		if run == nil && (rd.Draw > 0 || rd.Known || rd.Done) {
			run = &checkRun{results: make(chan peerAnswer, 16), t0: time.Now()}
		}
		for _, p := range rd.Ask {
			n.launch(ctx, run, peer.ID(p), req, timeout)
		}
		switch {
		case rd.Done:
			n.endRun(run)
			n.m.Checks.Inc()
			n.m.ObserveCheck(time.Since(run.t0).Seconds())
			n.m.Hedged.Add(float64(rd.Stats.Hedged))
			n.m.Cached.Add(float64(rd.Stats.Cached))
			if rd.Stats.EarlyFail {
				n.m.EarlyFail.Inc()
			}
			if rd.Stats.KnownBehind {
				n.m.KnownBehind.Inc()
			}
			n.paces.note(ck, n.clock())
			n.m.Excused.WithLabelValues(psp.Slow.String()).Add(float64(rd.Stats.Slow))
			n.m.Excused.WithLabelValues(psp.Far.String()).Add(float64(rd.Stats.Far))
			run = nil
			// A node that left or shut down must not pass on what a
			// closed overlay gave (no sample, so no observation).
			if err := n.stopErr(ctx); err != nil {
				return out, err
			}
			out.Checks++
			n.iso.set(rd.Isolated, time.Now())
			// A node that must realign (on another lineage than the job's,
			// or wedged far ahead of its peers) does so here, and passes
			// if that moved it: its step is then the job's (realign.go).
			if !rd.Pass && !once {
				n.noteWedge(ck.Observations())
				if n.realignDue() && n.realign(ctx) {
					out.Waited, out.Realigned = time.Since(start), true
					return out, nil
				}
			}
			if rd.Pass || once {
				out.Waited = time.Since(start)
				return out, nil
			}
			out.Failed, out.Observed, out.Isolated = rd.Decision, rd.Stats.Observed, rd.Isolated
			n.setWaiting(true)
		case rd.Draw > 0:
			// A draw never blocks: the node's lifetime, not the check's
			// ctx, bounds it (a check ends with ctx all the same).
			peers := n.sample(n.life, rd.Draw) // fewer (or none) when the job is small
			if f := n.cfg.faults.OnSample; f != nil && run.draws == 0 && len(peers) > 0 {
				f(peers)
			}
			heard := len(peers) == 0 && n.iso.lately(time.Now())
			if run.draws == 0 && !once && !n.cfg.Barrier.Dynamic() {
				// The check's sample: peers whose answers already put
				// them at or above its threshold count without asking
				// (progress.go). observe asks every peer it draws.
				ck.DrawnKnown(ids(peers), n.progress.VouchedAll(peers, time.Now()), heard, n.clock())
			} else {
				ck.Drawn(ids(peers), heard, n.clock())
			}
			run.draws++
			continue
		case rd.Known:
			peers := n.ov.Peers()
			ck.Known(n.progress.KnownAll(peers, time.Now()), len(peers) == 0 && n.iso.lately(time.Now()), n.clock())
			continue
		}
		var tick <-chan time.Time
		if rd.Wake > 0 {
			timer.Reset(n.until(rd.Wake))
			tick = timer.C
		}
		var results <-chan peerAnswer
		if run != nil {
			results = run.results
		}
		select {
		case <-ctx.Done():
			return out, n.stopErr(ctx)
		case <-n.active.Done():
			return out, ErrClosed
		case <-n.wake:
			ck.Woken(n.clock())
		case <-tick:
			// The wake time has come, whatever rounding to nanoseconds
			// and back says (a tick before it would only set the timer
			// again, for no time at all).
			ck.Tick(max(n.clock(), rd.Wake))
		case r := <-results:
			run.inflight--
			switch {
			case r.a.err == nil:
				o, counts := n.judge(r.p, r.a.reply, r.asked, &run.ev)
				ck.Answer(string(r.p), o, counts, n.clock())
			case r.stopped:
				ck.Failed(string(r.p), n.clock())
			default:
				n.failed(r.p, &run.ev)
				ck.Failed(string(r.p), n.clock())
			}
		}
	}
}

// startBarrier starts ck on the node's step, with its timing inputs now,
// and returns the request its queries send.
func (n *Node) startBarrier(ck *psp.Checker) wire.StepRequest {
	pop := 0.0
	if n.cfg.Barrier.Probabilistic() {
		pop = n.pop.population()
	}
	req := wire.StepRequest{Step: n.step.Load(), Estimate: n.pop.estimate()}
	ck.Start(psp.CheckStart{
		Self: req.Step, Population: pop, Now: n.clock(),
		Compute: math.Float64frombits(n.compute.Load()), Interval: n.stepInterval(), RTT: n.rttEWMA(),
	})
	return req
}

// checkRun is one check's I/O: its queries in flight and what their
// answers tell of the peers, noted in the overlay when the check ends.
type checkRun struct {
	results  chan peerAnswer
	inflight int
	draws    int
	t0       time.Time
	ev       evidence
}

// launch asks p for its step, within timeout, on a goroutine of its own
// that ends within timeout or when ctx ends; its answer goes to
// run.results, marked stopped if ctx ended (the failure is then not the
// peer's).
func (n *Node) launch(ctx context.Context, run *checkRun, p peer.ID, req wire.StepRequest, timeout time.Duration) {
	run.inflight++
	results := run.results
	go func() {
		r, err := n.asker.Ask(ctx, p, req, timeout)
		results <- peerAnswer{p: p, a: answer{r, err}, stopped: err != nil && ctx.Err() != nil, asked: req.Step} // read by the check, or by drain
	}()
}

// endRun notes what a check learnt of its peers, and leaves the answers
// still to come to drain. A nil run is none.
func (n *Node) endRun(run *checkRun) {
	if run == nil {
		return
	}
	n.note(&run.ev)
	if run.inflight > 0 {
		go n.drain(run.results, run.inflight) // ends when every query has
		run.inflight = 0
	}
}

// stopErr is why a wait under ctx must stop: ErrClosed once the node has
// left or shut down, else ctx's error (nil while it runs).
func (n *Node) stopErr(ctx context.Context) error {
	if n.active.Err() != nil {
		return ErrClosed
	}
	return ctx.Err()
}

// sample draws up to k peers uniformly through the overlay. When the overlay
// holds fewer than k verified peers (a small job, or early on) it returns
// every peer it knows instead, in random order.
func (n *Node) sample(ctx context.Context, k int) []peer.ID {
	if k <= 0 {
		return nil
	}
	peers, err := n.ov.Sample(ctx, k)
	if err == nil {
		return peers
	}
	if !errors.Is(err, overlay.ErrNotEnoughPeers) {
		return nil
	}
	peers = n.ov.Peers()
	n.rngMu.Lock()
	n.rng.Shuffle(len(peers), func(i, j int) { peers[i], peers[j] = peers[j], peers[i] })
	n.rngMu.Unlock()
	return peers[:min(k, len(peers))]
}

// clock is the node's time for its Checker: seconds since it started.
func (n *Node) clock() float64 { return time.Since(n.started).Seconds() }

// until is how long until t on the node's clock (rounded up, so that a
// timer set for t does not fire before it).
func (n *Node) until(t float64) time.Duration {
	return time.Until(n.started.Add(dur(t)))
}

// dur converts seconds to a duration, rounded up to the nanosecond.
func dur(s float64) time.Duration { return time.Duration(math.Ceil(s * 1e9)) }

// ids converts peer IDs to the Checker's peer strings.
func ids(peers []peer.ID) []string {
	out := make([]string, len(peers))
	for i, p := range peers {
		out[i] = string(p)
	}
	return out
}
