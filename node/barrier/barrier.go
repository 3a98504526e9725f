package barrier

import (
	"context"
	"errors"
	"math"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/pspnode/pspnode/internal/faults"
	"github.com/pspnode/pspnode/internal/lineage"
	"github.com/pspnode/pspnode/internal/progress"
	"github.com/pspnode/pspnode/internal/wire"
	"github.com/pspnode/pspnode/node/status"
	"github.com/pspnode/pspnode/overlay"
	"github.com/pspnode/pspnode/psp"
)

// Barrier is the node's barrier: the Checker and the state its I/O keeps
// (the screen of peers' reports, their known steps and paces, the wake of
// progress reports), with the parts of the node it works through (Parts).
type Barrier struct {
	n   Node
	cfg Config
	m   *status.Metrics
	// The node's parts the barrier reads or tells. ov is set once the
	// overlay is up, before the first check (SetOverlay).
	ov      *overlay.Overlay
	pop     Census
	iso     Isolation
	boot    Startup
	kin     Kin
	asker   *wire.Asker
	step    *atomic.Int64  // the node's step
	compute *atomic.Uint64 // float64 bits: EWMA seconds of task compute per step
	// interval: float64 bits, EWMA seconds per step.
	interval *atomic.Uint64
	started  time.Time
	// life ends when the node shuts down, active when it leaves too.
	life, active context.Context
	shuffle      func(n int, swap func(i, j int)) // the node's random source

	checker *psp.Checker // the barrier's policy; only the barrier's goroutine uses it
	// screen judges peers' step reports (nil: off); used only by the
	// barrier's goroutine.
	screen *psp.Screen
	// progress holds peers' known steps and the waiters to tell when this
	// node advances (progress.go).
	progress *progress.Table
	paces    paceBook // the peers' paces, for other goroutines (pace.go)
	wake     chan struct{}
	waiting  atomic.Bool
	// wedge watches the failed checks for the node being far ahead of
	// every peer (the node's realignment); wedged is set when it is, and
	// cleared by the realignment. Only the barrier's goroutine uses wedge.
	wedge  *psp.Wedge
	wedged atomic.Bool
}

// Config is what the barrier runs by.
type Config struct {
	// Check is the Checker's policy (the barrier spec, replacements,
	// timing shares, floors and caps, the pace rule).
	Check psp.CheckConfig
	// Screen holds peers to their earlier reports (zero: off).
	Screen psp.ScreenConfig
	// Faults are the test faults of the node (nil: none); read at each
	// draw, so a test may set them after New.
	Faults *faults.Node
}

// Node is what the barrier needs of its node beyond its parts: the
// realignment a failed check may call for, and the node's events.
type Node interface {
	// RealignDue says whether the node should take the job's step and
	// model again (another lineage, or wedged); Realign does, and says
	// whether the node's step moved.
	RealignDue() bool
	Realign(ctx context.Context) bool
	// PeerFailed: a step query to p failed while the node runs.
	PeerFailed(p peer.ID)
}

// Census is the node's population estimate.
type Census interface {
	// Estimate is the node's own estimate (sent in step queries);
	// Population what its barriers and learning rate use.
	Estimate() float64
	Population() float64
	// Repopulate recounts after peers came or went; NotePeerEstimate
	// takes a peer's reported estimate.
	Repopulate()
	NotePeerEstimate(est float64)
}

// Isolation is the record of the peers heard from lately.
type Isolation interface {
	NoteHeard(peers ...peer.ID)
	NoteLeft(p peer.ID)
	Forget(p peer.ID)
	Lately(now time.Time) bool
	// Set records whether the last check heard from no peer.
	Set(isolated bool, now time.Time)
}

// Kin is the node's lineage and model identity: whether a peer's reply
// is of this job (its model and lineage).
type Kin interface {
	Admit(p peer.ID, ext *wire.StepExt, quiet bool) lineage.Kinship
	// ForgetLineage forgets what p showed of its lineage (it left or
	// failed).
	ForgetLineage(p peer.ID)
}

// Startup marks the node's start-up milestones.
type Startup interface {
	// FirstPeer: a peer of the job answered or asked.
	FirstPeer()
}

// Parts are what New builds a barrier of.
type Parts struct {
	Node      Node
	Config    Config
	Metrics   *status.Metrics
	Census    Census
	Isolation Isolation
	Startup   Startup
	Kin       Kin
	Asker     *wire.Asker
	// Step is the node's step; Compute its EWMA compute seconds per step
	// and Interval its EWMA seconds per step (float64 bits).
	Step              *atomic.Int64
	Compute, Interval *atomic.Uint64
	Started           time.Time
	// Life ends when the node shuts down, Active when it leaves too.
	Life, Active context.Context
	// Shuffle is the node's random source.
	Shuffle func(n int, swap func(i, j int))
	// Decider decides a check (nil: the barrier's own rule).
	Decider psp.Decider
}

// New is the barrier of p's node; SetOverlay before its first check.
func New(p Parts) *Barrier {
	return &Barrier{
		n: p.Node, cfg: p.Config, m: p.Metrics, pop: p.Census, iso: p.Isolation, boot: p.Startup, kin: p.Kin,
		asker: p.Asker, step: p.Step, compute: p.Compute, interval: p.Interval, started: p.Started,
		life: p.Life, active: p.Active, shuffle: p.Shuffle,
		checker:  psp.NewChecker(p.Config.Check, p.Decider),
		screen:   screenFor(p.Config.Screen),
		progress: progress.New(),
		wake:     make(chan struct{}, 1),
		wedge:    psp.NewWedge(p.Config.Check.Spec.BaseStaleness()),
	}
}

// SetOverlay gives the barrier the node's overlay, once it is up.
func (b *Barrier) SetOverlay(ov *overlay.Overlay) { b.ov = ov }

// screenFor is the screen of c (nil: off).
func screenFor(c psp.ScreenConfig) *psp.Screen {
	if c == (psp.ScreenConfig{}) {
		return nil
	}
	return psp.NewScreen(c)
}

// ErrClosed is what a wait returns once the node has left or shut down.
var ErrClosed = errors.New("node: closed")

// noteWedge takes a failed check that observed obs: the node is wedged
// once psp.Wedge says so. Only the barrier's goroutine calls it.
func (b *Barrier) noteWedge(obs []psp.Observation) {
	if b.wedge.Check(b.step.Load(), b.clock(), obs) {
		b.wedged.Store(true)
	}
}

// poke wakes a barrier that waits (a peer progressed, or left).
func (b *Barrier) Poke() {
	select {
	case b.wake <- struct{}{}:
	default:
	}
}

// setWaiting records whether the node waits at its barrier.
func (b *Barrier) setWaiting(w bool) {
	b.waiting.Store(w)
	if w {
		b.m.Waiting.Set(1)
	} else {
		b.m.Waiting.Set(0)
	}
}

// stepInterval is the node's EWMA seconds per step.
func (b *Barrier) StepInterval() float64 { return math.Float64frombits(b.interval.Load()) }

// resetPeers forgets what the barrier held of its peers' steps and
// reports: they were of the node's old step or lineage.
func (b *Barrier) ResetPeers() {
	b.screen = screenFor(b.cfg.Screen)
	b.progress.Reset()
}

// query asks one peer for its step, within the query timeout of the
// node's timing now.
func (b *Barrier) Query(ctx context.Context, p peer.ID, req wire.StepRequest) (wire.StepReply, error) {
	return b.asker.Ask(ctx, p, req, b.queryTimeout())
}

// Outcome is what one pass of the barrier took: the checks, the
// time, and the last check that failed (its decision and how many peers
// it observed), if any did.
type Outcome struct {
	Checks   int
	Waited   time.Duration
	Failed   psp.Decision // the last failed check's decision; Lagging 0 if none failed
	Observed int          // how many peers that check observed
	Isolated bool         // that check heard from no peer (psp.Isolated)
	// Realigned: the node took the job's step and model instead of
	// passing (realign.go); its step is not the one the barrier began at.
	Realigned bool
}

// wait blocks until the barrier lets the node start its next step. The
// timing and population it works with are taken once, at its start.
//
// It returns ErrClosed as soon as the node leaves or shuts down. (It does
// not end ctx when it returns: a query of its last check runs on, to its
// own deadline, under ctx.)
func (b *Barrier) Wait(ctx context.Context) (Outcome, error) {
	out, err := b.drive(ctx, b.checker, false)
	b.setWaiting(false)
	if err == nil {
		b.m.ObserveWait(out.Waited.Seconds())
	}
	return out, err
}

// observe runs one barrier check, with a Checker of its own, and returns
// what it observed (tests and benchmarks).
func (b *Barrier) Observe(ctx context.Context) []psp.Observation {
	ck := psp.NewChecker(b.cfg.Check, nil)
	_, _ = b.drive(ctx, ck, true)
	return ck.Observations()
}

// drive runs the barrier's checks, as ck's policy says, until one passes
// (or, once, until the first ends): it carries out what ck.Ready says
// (draws from the overlay, step queries, a timer for ck's wake time) and
// hands ck the answers, the timer's ticks and the progress reports that
// wake the node. Each check's queries send their answers to a channel of
// its own; those the check no longer needs run on to their own deadline,
// and what they tell still counts (drain).
func (b *Barrier) drive(ctx context.Context, ck *psp.Checker, once bool) (Outcome, error) {
	start := time.Now()
	var out Outcome
	req := b.startBarrier(ck)
	timeout := dur(ck.Timing().Timeout)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var run *checkRun // the check in progress; nil between checks
	defer func() { b.endRun(run) }()
	for {
		rd := ck.Ready()
		if run == nil && (rd.Draw > 0 || rd.Known || rd.Done) {
			run = &checkRun{results: make(chan PeerAnswer, 16), t0: time.Now()}
		}
		for _, p := range rd.Ask {
			b.launch(ctx, run, peer.ID(p), req, timeout)
		}
		switch {
		case rd.Done:
			b.endRun(run)
			b.m.Checks.Inc()
			b.m.ObserveCheck(time.Since(run.t0).Seconds())
			b.m.Hedged.Add(float64(rd.Stats.Hedged))
			b.m.Cached.Add(float64(rd.Stats.Cached))
			if rd.Stats.EarlyFail {
				b.m.EarlyFail.Inc()
			}
			if rd.Stats.KnownBehind {
				b.m.KnownBehind.Inc()
			}
			b.paces.note(ck, b.clock())
			b.m.Excused.WithLabelValues(psp.Slow.String()).Add(float64(rd.Stats.Slow))
			b.m.Excused.WithLabelValues(psp.Far.String()).Add(float64(rd.Stats.Far))
			run = nil
			// A node that left or shut down must not pass on what a
			// closed overlay gave (no sample, so no observation).
			if err := b.stopErr(ctx); err != nil {
				return out, err
			}
			out.Checks++
			b.iso.Set(rd.Isolated, time.Now())
			// A node that must realign (on another lineage than the job's,
			// or wedged far ahead of its peers) does so here, and passes
			// if that moved it: its step is then the job's (realign.go).
			if !rd.Pass && !once {
				b.noteWedge(ck.Observations())
				if b.n.RealignDue() && b.n.Realign(ctx) {
					out.Waited, out.Realigned = time.Since(start), true
					return out, nil
				}
			}
			if rd.Pass || once {
				out.Waited = time.Since(start)
				return out, nil
			}
			out.Failed, out.Observed, out.Isolated = rd.Decision, rd.Stats.Observed, rd.Isolated
			b.setWaiting(true)
		case rd.Draw > 0:
			// A draw never blocks: the node's lifetime, not the check's
			// ctx, bounds it (a check ends with ctx all the same).
			peers := b.Sample(b.life, rd.Draw) // fewer (or none) when the job is small
			if f := b.onSample(); f != nil && run.draws == 0 && len(peers) > 0 {
				f(peers)
			}
			heard := len(peers) == 0 && b.iso.Lately(time.Now())
			if run.draws == 0 && !once && !b.cfg.Check.Spec.Dynamic() {
				// The check's sample: peers whose answers already put
				// them at or above its threshold count without asking
				// (progress.go). observe asks every peer it draws.
				ck.DrawnKnown(ids(peers), b.progress.VouchedAll(peers, time.Now()), heard, b.clock())
			} else {
				ck.Drawn(ids(peers), heard, b.clock())
			}
			run.draws++
			continue
		case rd.Known:
			peers := b.ov.Peers()
			ck.Known(b.progress.KnownAll(peers, time.Now()), len(peers) == 0 && b.iso.Lately(time.Now()), b.clock())
			continue
		}
		var tick <-chan time.Time
		if rd.Wake > 0 {
			timer.Reset(b.until(rd.Wake))
			tick = timer.C
		}
		var results <-chan PeerAnswer
		if run != nil {
			results = run.results
		}
		select {
		case <-ctx.Done():
			return out, b.stopErr(ctx)
		case <-b.active.Done():
			return out, ErrClosed
		case <-b.wake:
			ck.Woken(b.clock())
		case <-tick:
			// The wake time has come, whatever rounding to nanoseconds
			// and back says (a tick before it would only set the timer
			// again, for no time at all).
			ck.Tick(max(b.clock(), rd.Wake))
		case r := <-results:
			run.inflight--
			switch {
			case r.A.Err == nil:
				o, counts := b.judge(r.Peer, r.A.Reply, r.Asked, &run.ev)
				ck.Answer(string(r.Peer), o, counts, b.clock())
			case r.Stopped:
				ck.Failed(string(r.Peer), b.clock())
			default:
				b.failed(r.Peer, &run.ev)
				ck.Failed(string(r.Peer), b.clock())
			}
		}
	}
}

// startBarrier starts ck on the node's step, with its timing inputs now,
// and returns the request its queries send.
func (b *Barrier) startBarrier(ck *psp.Checker) wire.StepRequest {
	pop := 0.0
	if b.cfg.Check.Spec.Probabilistic() {
		pop = b.pop.Population()
	}
	req := wire.StepRequest{Step: b.step.Load(), Estimate: b.pop.Estimate()}
	ck.Start(psp.CheckStart{
		Self: req.Step, Population: pop, Now: b.clock(),
		Compute: math.Float64frombits(b.compute.Load()), Interval: b.StepInterval(), RTT: b.m.RTTEWMA(),
	})
	return req
}

// checkRun is one check's I/O: its queries in flight and what their
// answers tell of the peers, noted in the overlay when the check ends.
type checkRun struct {
	results  chan PeerAnswer
	inflight int
	draws    int
	t0       time.Time
	ev       evidence
}

// launch asks p for its step, within timeout, on a goroutine of its own
// that ends within timeout or when ctx ends; its answer goes to
// run.results, marked stopped if ctx ended (the failure is then not the
// peer's).
func (b *Barrier) launch(ctx context.Context, run *checkRun, p peer.ID, req wire.StepRequest, timeout time.Duration) {
	run.inflight++
	results := run.results
	go func() {
		r, err := b.asker.Ask(ctx, p, req, timeout)
		results <- PeerAnswer{Peer: p, A: Answer{r, err}, Stopped: err != nil && ctx.Err() != nil, Asked: req.Step} // read by the check, or by drain
	}()
}

// endRun notes what a check learnt of its peers, and leaves the answers
// still to come to drain. A nil run is none.
func (b *Barrier) endRun(run *checkRun) {
	if run == nil {
		return
	}
	b.note(&run.ev)
	if run.inflight > 0 {
		go b.Drain(run.results, run.inflight) // ends when every query has
		run.inflight = 0
	}
}

// stopErr is why a wait under ctx must stop: ErrClosed once the node has
// left or shut down, else ctx's error (nil while it runs).
func (b *Barrier) stopErr(ctx context.Context) error {
	if b.active.Err() != nil {
		return ErrClosed
	}
	return ctx.Err()
}

// sample draws up to k peers uniformly through the overlay. When the overlay
// holds fewer than k verified peers (a small job, or early on) it returns
// every peer it knows instead, in random order.
func (b *Barrier) Sample(ctx context.Context, k int) []peer.ID {
	if k <= 0 {
		return nil
	}
	peers, err := b.ov.Sample(ctx, k)
	if err == nil {
		return peers
	}
	if !errors.Is(err, overlay.ErrNotEnoughPeers) {
		return nil
	}
	peers = b.ov.Peers()
	b.shuffle(len(peers), func(i, j int) { peers[i], peers[j] = peers[j], peers[i] })
	return peers[:min(k, len(peers))]
}

// onSample is the test fault hook of draws (nil: none).
func (b *Barrier) onSample() func([]peer.ID) {
	if b.cfg.Faults == nil {
		return nil
	}
	return b.cfg.Faults.OnSample
}

// clock is the node's time for its Checker: seconds since it started.
func (b *Barrier) clock() float64 { return time.Since(b.started).Seconds() }

// until is how long until t on the node's clock (rounded up, so that a
// timer set for t does not fire before it).
func (b *Barrier) until(t float64) time.Duration {
	return time.Until(b.started.Add(dur(t)))
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

// Progress is what the barrier knows of its peers' steps without asking,
// and whom it tells when the node advances.
func (b *Barrier) Progress() *progress.Table { return b.progress }

// Waiting says whether the node waits at its barrier.
func (b *Barrier) Waiting() bool { return b.waiting.Load() }

// Shuffle shuffles with the node's random source.
func (b *Barrier) Shuffle(n int, swap func(i, j int)) { b.shuffle(n, swap) }

// Wedged says whether the failed checks found the node far ahead of every
// peer it samples (psp.Wedge); TakeWedged says so and clears it, for the
// realignment that follows.
func (b *Barrier) Wedged() bool     { return b.wedged.Load() }
func (b *Barrier) TakeWedged() bool { return b.wedged.Swap(false) }

// WedgeGap is how far behind the node every observed step of a check must
// be for the check to count as far ahead (psp.Wedge.Gap).
func (b *Barrier) WedgeGap() psp.Step { return b.wedge.Gap }

// ResetWedge starts the wedge watch's count again (the node moved).
func (b *Barrier) ResetWedge() { b.wedge.Reset() }
