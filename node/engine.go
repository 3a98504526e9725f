package node

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync/atomic"
	"time"
)

// Run trains until a stop criterion: cfg.MaxSteps, cfg.Duration, the task's
// own Done, or ctx. Each iteration is the Actor P2P engine's loop:
//
//	step    the task computes an iteration (schedule + pull happened as
//	        updates arrived by gossip and were applied)
//	push    the update is published on the job's GossipSub topic
//	barrier β peers are sampled through the overlay and asked for their
//	        steps in parallel; peers that do not answer within
//	        QueryTimeout are marked dead and replaced; psp decides; a node
//	        that must wait polls again with backoff and a fresh sample, and
//	        wakes early when a peer reports progress
//
// A stop by ctx, Duration or MaxSteps returns nil: the node abandons the
// step in progress. Run returns an error only if the task fails.
func (n *Node) Run(ctx context.Context) error {
	if n.cfg.Duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, n.cfg.Duration)
		defer cancel()
	}
	if n.waitPeers(ctx) != nil {
		return nil // stopped while waiting for peers
	}
	n.resume()
	if n.cfg.JoinFetch {
		n.join(ctx)
	}
	defer n.checkpoint()
	last := time.Now()
	for {
		if ctx.Err() != nil || n.task.Done() || (n.cfg.MaxSteps > 0 && n.step.Load() >= n.cfg.MaxSteps) {
			return nil
		}
		if pa, ok := n.task.(PopulationAware); ok && n.cfg.ScaleLR {
			pa.SetPopulation(n.population())
		}
		n.busy.Store(true)
		t0 := time.Now()
		upd, err := n.task.Step(ctx)
		n.busy.Store(false)
		noteEWMA(&n.compute, time.Since(t0).Seconds())
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			return fmt.Errorf("node: step %d: %w", n.step.Load()+1, err)
		}
		step := n.step.Add(1)
		n.m.step.Set(float64(step))
		now := time.Now()
		noteEWMA(&n.interval, now.Sub(last).Seconds())
		last = now
		n.pushProgress(ctx, step)
		if n.gs != nil {
			n.gs.SetLocalStep(step)
			if upd != nil {
				n.noteOwnNorm(upd)
				n.publish(ctx, step, upd)
			}
		}
		if n.cfg.Checkpoint != "" && n.cfg.CheckpointEvery > 0 && step%int64(n.cfg.CheckpointEvery) == 0 {
			n.checkpoint()
		}
		if n.cfg.EvalEvery > 0 && step%int64(n.cfg.EvalEvery) == 0 {
			n.evaluate(step)
		}
		if n.cfg.MaxSteps > 0 && step >= n.cfg.MaxSteps {
			return nil
		}
		if n.barrier(ctx) != nil {
			return nil // stopped while waiting at the barrier
		}
	}
}

// population is the node's best guess of the number of nodes: the overlay's
// estimate, unless it is off by more than a factor of two from the median
// of the estimates peers reported lately (reportedPopulation), which then
// wins; without an overlay estimate, that median; and never fewer than
// itself plus the live peers it knows.
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
func (n *Node) population() float64 {
	est, _, err := n.ov.Estimate()
	if err != nil {
		est = 0
	}
	rep, haveRep := n.reportedPopulation()
	return choosePopulation(est, rep, haveRep, len(n.ov.Peers()))
}

// choosePopulation is population's rule, given the overlay's estimate (0:
// none), the median of peer reports (haveRep: there are enough) and the
// number of live peers the node knows.
func choosePopulation(est, rep float64, haveRep bool, known int) float64 {
	floor := float64(1 + known)
	switch {
	case est >= 1 && (!haveRep || (est >= rep/2 && est <= 2*rep)):
		return max(est, floor)
	case haveRep:
		return max(rep, floor)
	}
	return floor
}

// minReports is how many peer reports reportedPopulation needs.
const minReports = 3

// notePeerEstimate records a population estimate a peer reported in a
// step query or reply. Nonsense is ignored.
func (n *Node) notePeerEstimate(est float64) {
	if !(est >= 1) || est > 1e9 {
		return
	}
	n.repMu.Lock()
	n.reports.add(est)
	n.repMu.Unlock()
}

// reportedPopulation is the median of the last peer reports of the
// population (up to 32), if there are at least minReports. The median
// keeps a few lying peers from moving it.
func (n *Node) reportedPopulation() (float64, bool) {
	n.repMu.Lock()
	v := n.reports.values()
	n.repMu.Unlock()
	if len(v) < minReports {
		return 0, false
	}
	slices.Sort(v)
	return v[len(v)/2], true
}

// pollMax is the longest backoff between two checks of a waiting node:
// PollMax, and for a sampled barrier at most PollShare of the mean compute
// time per step (see Config.PollShare).
func (n *Node) pollMax() time.Duration {
	if !n.cfg.Barrier.Probabilistic() || n.cfg.PollShare <= 0 {
		return n.cfg.PollMax
	}
	c := time.Duration(n.cfg.PollShare * math.Float64frombits(n.compute.Load()) * float64(time.Second))
	return min(max(c, n.cfg.PollMin), n.cfg.PollMax)
}

// noteEWMA folds one sample, in seconds, into an EWMA stored as float64
// bits (weight 0.3 for the new sample; the first sample is taken as is).
func noteEWMA(a *atomic.Uint64, s float64) {
	if old := math.Float64frombits(a.Load()); old > 0 {
		s = 0.3*s + 0.7*old
	}
	a.Store(math.Float64bits(s))
}

func (n *Node) evaluate(step int64) {
	ev, ok := n.task.(Evaluator)
	if !ok {
		return
	}
	m, err := ev.Evaluate()
	if err != nil {
		n.log.Debug("evaluation failed", "err", err)
		return
	}
	n.m.loss.Set(m.Loss)
	n.m.accuracy.Set(m.Accuracy)
	n.lastEval.Store(&evalResult{Step: step, Loss: m.Loss, Accuracy: m.Accuracy})
	n.log.Info("evaluated", "step", step, "loss", m.Loss, "accuracy", m.Accuracy)
}

func (n *Node) setWaiting(w bool) {
	n.waiting.Store(w)
	if w {
		n.m.waiting.Set(1)
	} else {
		n.m.waiting.Set(0)
	}
}

// barrier blocks until the barrier lets the node start its next step.
func (n *Node) barrier(ctx context.Context) error {
	start := time.Now()
	backoff, most := n.cfg.PollMin, n.pollMax()
	for first := true; ; first = false {
		t0 := time.Now()
		obs := n.observe(ctx)
		if ctx.Err() != nil {
			n.setWaiting(false)
			return ctx.Err()
		}
		n.m.checks.Inc()
		checked := time.Now()
		n.m.observeCheck(checked.Sub(t0).Seconds())
		d := n.decider.Decide(n.step.Load(), time.Since(n.started).Seconds(), obs)
		if d.Pass {
			n.setWaiting(false)
			n.m.observeWait(time.Since(start).Seconds())
			return nil
		}
		if first {
			n.setWaiting(true)
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			n.setWaiting(false)
			return ctx.Err()
		case <-n.wake:
			// A peer at or behind this node progressed. Re-check soon,
			// but no sooner than WakeGap (at least PollMin) after the last
			// check, so a burst of progress reports costs one check; and
			// no later than the backoff would have (early in a wait the
			// backoff is shorter than WakeGap: a wake must not delay).
			t.Stop()
			gap := min(max(n.cfg.WakeGap, n.cfg.PollMin), backoff)
			if sleepCtx(ctx, gap-time.Since(checked)); ctx.Err() != nil {
				n.setWaiting(false)
				return ctx.Err()
			}
		case <-t.C:
		}
		backoff = min(2*backoff, most)
	}
}
