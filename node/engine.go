package node

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/pspnode/pspnode/overlay"
	"github.com/pspnode/pspnode/psp"
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

// publish sends the step's update on the gossip topic (or, for a node
// playing a poisoner, what Faults.Poison makes of it).
func (n *Node) publish(ctx context.Context, step int64, upd []float64) {
	var err error
	if poison := n.cfg.Faults.Poison; poison != nil {
		if raw := poison(step, upd); raw != nil {
			err = n.gs.PublishRaw(ctx, raw)
		}
	} else {
		err = n.gs.Publish(ctx, step, upd)
	}
	if err != nil && ctx.Err() == nil {
		n.log.Warn("publish failed", "step", step, "err", err)
	}
}

// resume loads the checkpoint, if one is configured and present. A bad
// checkpoint is logged and ignored; join then fetches the model from peers.
func (n *Node) resume() {
	if n.cfg.Checkpoint == "" {
		return
	}
	c, err := ReadCheckpoint(n.cfg.Checkpoint)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return
	case err != nil:
		n.log.Error("ignoring checkpoint; the model will come from peers", "file", n.cfg.Checkpoint, "err", err)
		return
	case c.Job != n.cfg.Job || c.ModelID != n.task.ModelID() || len(c.Params) != n.task.NumParams():
		n.log.Error("ignoring checkpoint of another job or model; the model will come from peers",
			"file", n.cfg.Checkpoint, "job", c.Job, "params", len(c.Params))
		return
	}
	if len(c.Params) > 0 {
		if err := n.task.SetParams(c.Params); err != nil {
			n.log.Error("ignoring checkpoint", "file", n.cfg.Checkpoint, "err", err)
			return
		}
	}
	n.step.Store(c.Step)
	n.m.step.Set(float64(c.Step))
	n.log.Info("resumed from checkpoint", "file", n.cfg.Checkpoint, "step", c.Step)
}

// checkpoint writes the step and model to the checkpoint file.
func (n *Node) checkpoint() {
	if n.cfg.Checkpoint == "" {
		return
	}
	c := Checkpoint{Job: n.cfg.Job, Step: n.step.Load(), ModelID: n.task.ModelID(), Params: n.task.Params()}
	if err := WriteCheckpoint(n.cfg.Checkpoint, c); err != nil {
		n.log.Warn("checkpoint failed", "err", err)
	}
}

// population is the node's best guess of the number of nodes: the overlay's
// estimate, or, while that has too little data, itself plus the peers it
// knows.
func (n *Node) population() float64 {
	if est, _, err := n.ov.Estimate(); err == nil && est >= 1 {
		return est
	}
	return float64(1 + len(n.ov.Peers()))
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

// waitPeers blocks until the overlay knows cfg.WaitPeers peers, or
// StartTimeout passes (then it goes on with what it has).
func (n *Node) waitPeers(ctx context.Context) error {
	if n.cfg.WaitPeers <= 0 {
		return nil
	}
	deadline := time.Now().Add(n.cfg.StartTimeout)
	for len(n.ov.Peers()) < n.cfg.WaitPeers && time.Now().Before(deadline) {
		t := time.NewTimer(50 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}

// join adopts a step and the model of a running job. It asks up to
// psp.JoinSample peers for their steps; if the job has started (the median
// is above this node's step), it adopts psp.JoinStep and fetches the model
// from an answering peer (trying up to three), verifying it. If every fetch
// fails it trains from its own parameters and says so.
func (n *Node) join(ctx context.Context) {
	// A joiner's overlay may not have verified any peer yet: give it up to
	// StartTimeout to find one before deciding the job has not started.
	if len(n.cfg.Bootstrap) > 0 || len(n.cfg.Overlay.BootstrapPeers) > 0 {
		deadline := time.Now().Add(n.cfg.StartTimeout)
		for len(n.ov.Peers()) == 0 && time.Now().Before(deadline) && ctx.Err() == nil {
			time.Sleep(20 * time.Millisecond)
		}
	}
	peers := n.sample(ctx, psp.JoinSample)
	if len(peers) == 0 {
		return
	}
	replies := n.ask(ctx, peers)
	var steps []psp.Step
	var answered []peer.ID
	for i, r := range replies {
		if r.err == nil && !r.reply.Leaving {
			steps = append(steps, r.reply.Step)
			answered = append(answered, peers[i])
		}
	}
	adopt := psp.JoinStep(steps)
	if adopt <= n.step.Load() {
		return
	}
	if n.task.NumParams() > 0 {
		fetched := false
		for i := 0; i < len(answered) && i < 3 && !fetched; i++ {
			snap, err := n.fetchModel(ctx, answered[i])
			if err == nil {
				err = n.task.SetParams(snap.Params)
			}
			if err != nil {
				n.log.Warn("model fetch failed", "peer", answered[i], "err", err)
				continue
			}
			fetched = true
			n.log.Info("joined a running job: fetched the model", "peer", answered[i], "peer_step", snap.Step)
		}
		if !fetched {
			n.log.Warn("joined a running job but could not fetch the model: training from own parameters")
		}
	}
	n.step.Store(adopt)
	n.m.step.Set(float64(adopt))
	if n.gs != nil {
		n.gs.SetLocalStep(adopt)
	}
	n.log.Info("adopted step", "step", adopt, "observed", len(steps))
}

type answer struct {
	reply StepReply
	err   error
}

// ask queries peers in parallel; each query has its own deadline.
func (n *Node) ask(ctx context.Context, peers []peer.ID) []answer {
	out := make([]answer, len(peers))
	req := StepRequest{Step: n.step.Load(), Estimate: n.estimate()}
	var wg sync.WaitGroup
	for i, p := range peers {
		wg.Go(func() {
			r, err := n.queryStep(ctx, p, req)
			out[i] = answer{r, err}
		})
	}
	wg.Wait()
	return out
}

// observe draws the barrier's sample and asks it for steps. Global barriers
// ask every known peer and wait for all answers. Sampled barriers hedge: a
// peer that fails, is leaving, or whose report the screen refuses is
// replaced by a fresh draw at once, and a peer that has not answered after
// the hedge delay (a few typical round trips) gets a fresh draw asked
// beside it (replacements too, once each); the check ends with the first β good answers. A slow peer
// thus costs a check a few round trips, not the full query timeout. Up to
// Replacements × β fresh draws are made per check. Queries the check no
// longer needs run on to their own deadline. Only the Run goroutine
// calls observe (n.screen is not safe for concurrent use).
func (n *Node) observe(ctx context.Context) []psp.Observation {
	sp := n.cfg.Barrier
	if sp.Kind == psp.ASP {
		return nil
	}
	if sp.Global() {
		// Ask every known peer, except (for BSP and SSP) those already
		// seen at or above this check's threshold: steps only grow, so
		// they cannot be lagging (see progress).
		var obs []psp.Observation
		var ask []peer.ID
		threshold := n.step.Load() - int64(sp.BaseStaleness())
		cache := !sp.Dynamic() // DSSP weighs the fastest and slowest reports: ask all
		for _, p := range n.ov.Peers() {
			if s, ok := n.progress.atLeast(p, threshold); cache && ok {
				obs = append(obs, psp.Observation{Peer: string(p), Step: s})
				continue
			}
			ask = append(ask, p)
		}
		n.m.cached.Add(float64(len(obs)))
		for i, a := range n.ask(ctx, ask) {
			if o, ok := n.judge(ctx, ask[i], a); ok {
				obs = append(obs, o)
			}
		}
		return obs
	}
	peers := n.sample(ctx, sp.Beta) // fewer (or none) when the job is small
	if n.cfg.OnSample != nil && len(peers) > 0 {
		n.cfg.OnSample(peers)
	}
	want := len(peers)
	if want == 0 {
		return nil
	}
	budget := n.cfg.Replacements * want
	type result struct {
		p peer.ID
		a answer
	}
	results := make(chan result, want+budget) // every query can send without blocking
	req := StepRequest{Step: n.step.Load(), Estimate: n.estimate()}
	asked := make(map[peer.ID]bool, want+budget)
	unhedged := make(map[peer.ID]time.Time, want) // outstanding queries not yet hedged: launch time
	outstanding := 0
	launch := func(p peer.ID) {
		asked[p] = true
		unhedged[p] = time.Now()
		outstanding++
		// A query outlives a check that ended without it (its answer is
		// dropped), so that a peer that never answers is still found
		// dead at the query timeout and leaves the sampler.
		go func() { // ends within QueryTimeout, or when the node stops
			r, err := n.queryStep(ctx, p, req)
			if err != nil && ctx.Err() == nil {
				n.queryFailed(p)
			}
			results <- result{p, answer{r, err}} // buffered: never blocks
		}()
	}
	var spares []peer.ID
	replace := func(k int) {
		for ; k > 0 && budget > 0; k-- {
			if len(spares) == 0 {
				for _, p := range n.sample(ctx, want+len(asked)) {
					if !asked[p] {
						spares = append(spares, p)
					}
				}
				if len(spares) == 0 {
					return
				}
			}
			p := spares[0]
			spares = spares[1:]
			if asked[p] {
				k++
				continue
			}
			budget--
			launch(p)
		}
	}
	for _, p := range peers {
		launch(p)
	}
	// Every delay, each query older than delay that has not been hedged
	// yet (replacements included) gets one fresh draw beside it.
	delay := n.hedgeDelay()
	hedge := time.NewTicker(delay)
	defer hedge.Stop()
	// A static barrier (pBSP, pSSP) fails on any one answer behind it
	// (psp.Behind), so a check ends at the first such answer rather than
	// at the slowest of β: a waiting node re-checks sooner, as the
	// simulator's instantaneous checks do. Pass still needs β answers.
	// (pDSSP weighs every answer: it waits for all.)
	static := !sp.Dynamic()
	var obs []psp.Observation
	for outstanding > 0 && len(obs) < want {
		select {
		case <-ctx.Done():
			return obs
		case now := <-hedge.C:
			k := 0
			for p, at := range unhedged {
				if now.Sub(at) >= delay {
					delete(unhedged, p)
					k++
				}
			}
			n.m.hedged.Add(float64(k))
			replace(k)
		case r := <-results:
			outstanding--
			delete(unhedged, r.p)
			if r.a.err != nil {
				replace(1) // already marked dead by its goroutine
			} else if o, ok := n.judge(ctx, r.p, r.a); ok {
				obs = append(obs, o)
				if static && psp.Behind(req.Step, sp.BaseStaleness(), o.Step) {
					n.m.earlyFail.Inc()
					return obs
				}
			} else {
				replace(1)
			}
		}
	}
	return obs
}

// hedgeDelay is how long a sampled barrier check waits for an answer before
// it asks a fresh draw beside the slow peer: four smoothed round trips,
// within [PollMin, QueryTimeout/2].
func (n *Node) hedgeDelay() time.Duration {
	d := time.Duration(4 * n.rttEWMA() * float64(time.Second))
	return min(max(d, n.cfg.PollMin), n.cfg.QueryTimeout/2)
}

// judge turns one answer into an observation, or says why not: a failed
// query marks the peer dead, a leaving peer is dropped, and a report the
// screen refuses does not count.
func (n *Node) judge(ctx context.Context, p peer.ID, a answer) (psp.Observation, bool) {
	switch {
	case a.err != nil:
		if ctx.Err() == nil {
			n.queryFailed(p)
		}
		return psp.Observation{}, false
	case a.reply.Leaving:
		n.dropPeer(p)
		return psp.Observation{}, false
	}
	n.ov.MarkAlive(p)
	if a.reply.Estimate > 0 {
		n.ov.ObserveEstimate(p, a.reply.Estimate)
	}
	// Hold the peer to its earlier reports (psp.Screen). A stuck peer
	// that is not behind us cannot hold us back, so it still counts.
	v := psp.Accept
	if n.screen != nil {
		v = n.screen.Check(string(p), a.reply.Step, time.Since(n.started).Seconds(), n.stepInterval())
	}
	if v == psp.Stuck && a.reply.Step >= n.step.Load() {
		v = psp.Accept
	}
	if v != psp.Accept {
		n.m.screened.WithLabelValues(v.String()).Inc()
		return psp.Observation{}, false
	}
	n.progress.saw(p, a.reply.Step)
	return psp.Observation{Peer: string(p), Step: a.reply.Step, Interval: a.reply.Interval}, true
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
