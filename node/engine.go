package node

import (
	"context"
	"fmt"
	"math"
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
//	        steps in parallel; peers that do not answer within the query
//	        timeout are marked dead and replaced; psp decides; a node that
//	        must wait polls again with backoff and a fresh sample, and
//	        wakes early when a peer reports progress (barrier.go, psp.Checker)
//
// A stop by ctx, Duration or MaxSteps returns nil: the node abandons the
// step in progress. Run returns ErrClosed when the node leaves (Leave) or
// closes (Close) while it runs, or already has, as
// net/http's Serve returns ErrServerClosed; it returns any other error only
// if the task fails, or if the job it joins runs another model (a
// *ModelMismatchError).
func (n *Node) Run(ctx context.Context) error {
	if n.driver != nil {
		return fmt.Errorf("%w: its steps come from its Driver", ErrNotDriven)
	}
	if n.active.Err() != nil {
		return ErrClosed
	}
	if n.cfg.Duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, n.cfg.Duration)
		defer cancel()
	}
	// parent is the caller's stop (and Duration); ctx ends with it or when
	// the node leaves or shuts down.
	parent := ctx
	ctx, cancel := n.lifetime(ctx)
	defer cancel()
	stopped := func() error {
		if parent.Err() == nil && n.active.Err() != nil {
			return ErrClosed
		}
		return nil
	}
	if n.waitPeers(ctx) != nil {
		return stopped() // stopped while waiting for peers
	}
	n.resume()
	if n.cfg.JoinFetch {
		if err := n.join(ctx); err != nil {
			return err
		}
	}
	waitMesh(ctx, n.Gossip(), n.log)
	defer n.checkpoint()
	n.lastStepAt = time.Now()
	for {
		if ctx.Err() != nil || n.active.Err() != nil {
			return stopped()
		}
		if n.work.Done() || (n.cfg.MaxSteps > 0 && n.step.Load() >= n.cfg.MaxSteps) {
			return nil
		}
		if n.realignDue() {
			n.realign(ctx) // on another lineage than the job's, or wedged (realign.go)
		}
		if pa, ok := n.model.(PopulationAware); ok && n.cfg.ScaleLR {
			pa.SetPopulation(lrPopulation(&n.cfg, n.pop))
		}
		n.mergeTask() // epidemic: average in the models received
		n.busy.Store(true)
		t0 := time.Now()
		upd, err := n.work.Step(ctx)
		n.busy.Store(false)
		if ctx.Err() != nil || n.active.Err() != nil {
			return stopped()
		}
		if err != nil {
			return fmt.Errorf("node: step %d: %w", n.step.Load()+1, err)
		}
		step := n.countStep(ctx, time.Since(t0))
		n.pushTask(ctx, step, upd)
		if n.cfg.Checkpoint != "" && n.cfg.CheckpointEvery > 0 && step%int64(n.cfg.CheckpointEvery) == 0 {
			n.checkpoint()
		}
		if n.cfg.EvalEvery > 0 && step%int64(n.cfg.EvalEvery) == 0 {
			n.evaluate(step)
		}
		if n.cfg.MaxSteps > 0 && step >= n.cfg.MaxSteps {
			return nil
		}
		if _, err := n.bar.Wait(ctx); err != nil {
			return stopped() // stopped while waiting at the barrier
		}
	}
}

// The exchange takes and gives float32 vectors; a task's parameters and
// updates are its own, float64 (Task). mergeTask and pushTask are where
// Run converts them, once each way: the task stays float64 throughout,
// and the exchange sees nothing but float32.

// mergeTask averages the models received since the last step into the
// task's model, when the exchange averages (exchange.Kind.Averages): the
// task's parameters go to the exchange as float32, and the change the
// average made comes back added to them, so that the task's float64
// parameters keep what float32 does not hold.
func (n *Node) mergeTask() {
	if !n.cfg.Exchange.Kind.Averages() {
		return
	}
	p := n.model.Params()
	x := to32(p)
	k := n.exch().Merge(-1, x)
	if k == 0 {
		return
	}
	for i := range p {
		p[i] += float64(x[i] - float32(p[i])) // x held float32(p[i]) before the average
	}
	if err := n.model.SetParams(p); err != nil {
		n.m.ApplyRejected.Inc()
		n.log.Warn("averaging received models failed; keeping this node's model", "models", k, "err", err)
	}
}

// pushTask hands the exchange what step made, as float32: the task's
// model after the step when the exchange averages, else the step's
// update (nil: none).
func (n *Node) pushTask(ctx context.Context, step int64, upd []float64) {
	var v []float32
	switch {
	case n.cfg.Exchange.Kind.Averages():
		v = to32(n.model.Params())
	case upd != nil:
		v = to32(upd)
	}
	n.exch().Push(ctx, step, v, nil)
}

// lifetime returns a context that ends with ctx or when the node leaves or
// shuts down, whichever comes first.
func (n *Node) lifetime(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(n.active, cancel)
	return ctx, func() { stop(); cancel() }
}

// countStep counts a completed step whose task compute took compute and
// tells the peers this node was holding back. It returns the new step.
// Run and a Driver call it, one at a time; then the step's update goes to
// the exchange (exchange.Exchange.Push).
func (n *Node) countStep(ctx context.Context, compute time.Duration) int64 {
	noteEWMA(&n.compute, compute.Seconds())
	n.boot.mark(msFirstStep)
	step := n.step.Add(1)
	n.m.Step.Set(float64(step))
	n.emit(Stepped, "")
	now := time.Now()
	noteEWMA(&n.interval, now.Sub(n.lastStepAt).Seconds())
	n.lastStepAt = now
	n.bar.PushProgress(ctx, step)
	return step
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
	ev, ok := n.model.(Evaluator)
	if !ok {
		return
	}
	m, err := ev.Evaluate()
	if err != nil {
		n.log.Debug("evaluation failed", "err", err)
		return
	}
	n.m.Loss.Set(m.Loss)
	n.m.Accuracy.Set(m.Accuracy)
	n.lastEval.Store(&evalResult{Step: step, Loss: m.Loss, Accuracy: m.Accuracy})
	n.log.Info("evaluated", "step", step, "loss", m.Loss, "accuracy", m.Accuracy)
}
