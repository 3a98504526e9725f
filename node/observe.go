package node

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/pspnode/pspnode/overlay"
	"github.com/pspnode/pspnode/psp"
)

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
// ask every known peer (observeGlobal). Sampled barriers hedge: a
// peer that fails, is leaving, or whose report the screen refuses is
// replaced by a fresh draw at once, and a peer that has not answered after
// the hedge delay (a few typical round trips) gets a fresh draw asked
// beside it (replacements too, once each); the check ends with the first β good answers. A slow peer
// thus costs a check a few round trips, not the full query timeout. Up to
// Replacements × β fresh draws are made per check. Queries the check no
// longer needs run on to their own deadline. Only the Run goroutine
// calls observe (n.screen is not safe for concurrent use).
func (n *Node) observe(ctx context.Context) []psp.Observation { return n.check(ctx).obs }

// check is what one barrier check saw: the observations it counts, how
// many peers it asked, and how many of them answered at all (an answer
// that does not count, from a leaving peer or one the screen refuses,
// included). The isolation policy (isolation.go) reads the last two.
type check struct {
	obs             []psp.Observation
	asked, answered int
}

// check is observe with the counts of peers asked and answering.
func (n *Node) check(ctx context.Context) (c check) {
	sp := n.cfg.Barrier
	if sp.Kind == psp.ASP {
		return c
	}
	if sp.Global() {
		return n.observeGlobal(ctx, sp)
	}
	peers := n.sample(ctx, sp.Beta) // fewer (or none) when the job is small
	if f := n.cfg.faults.OnSample; f != nil && len(peers) > 0 {
		f(peers)
	}
	want := len(peers)
	if want == 0 {
		return c
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
	delay := n.timing().hedge
	hedge := time.NewTicker(delay)
	defer hedge.Stop()
	// A static barrier (pBSP, pSSP) fails on any one answer behind it
	// (psp.Behind), so a check ends at the first such answer rather than
	// at the slowest of β: a waiting node re-checks sooner, as the
	// simulator's instantaneous checks do. Pass still needs β answers.
	// (pDSSP weighs every answer: it waits for all.)
	static := !sp.Dynamic()
	defer func() { c.asked = len(asked) }()
	for outstanding > 0 && len(c.obs) < want {
		select {
		case <-ctx.Done():
			return c
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
				continue
			}
			c.answered++
			if o, ok := n.judge(ctx, r.p, r.a); ok {
				c.obs = append(c.obs, o)
				if static && psp.Behind(req.Step, sp.BaseStaleness(), o.Step) {
					n.m.earlyFail.Inc()
					return c
				}
			} else {
				replace(1)
			}
		}
	}
	return c
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
		n.noteLeft(p)
		n.dropPeer(p)
		return psp.Observation{}, false
	}
	switch n.admit(p, a.reply.Ext, false) { // genesis.go
	case otherModel: // held out: not of this job, so no sign of its life either (isolation.go)
		n.unheard(p)
		return psp.Observation{}, false
	case otherFork: // alive, but its step is another lineage's
		n.noteHeard(p)
		n.ov.MarkAlive(p)
		return psp.Observation{}, false
	}
	n.noteHeard(p)
	n.ov.MarkAlive(p)
	if a.reply.Estimate > 0 {
		n.ov.ObserveEstimate(p, a.reply.Estimate)
		n.notePeerEstimate(a.reply.Estimate)
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

// observeGlobal is a global barrier's check (BSP, SSP, DSSP): it asks every
// known peer, except (for BSP and SSP) those already seen at or above this
// check's threshold: steps only grow, so they cannot be lagging (see
// progress). At N = 500 that was up to 499 step streams opened at once
// per check. So at most Config.GlobalQueries queries are in flight, the
// peers most likely to hold the node back asked first (never seen, then
// the lowest known steps), and a BSP or SSP check ends at the first answer
// behind its threshold, as a sampled static one does: one such answer
// fails it whatever the others say, and a waiting node's checks then cost
// a few queries, not N − 1. (DSSP weighs every answer: it asks them all,
// GlobalQueries at a time.) Queries the check no longer needs run on to
// their own deadline.
func (n *Node) observeGlobal(ctx context.Context, sp psp.Spec) (c check) {
	req := StepRequest{Step: n.step.Load(), Estimate: n.estimate()}
	threshold := req.Step - int64(sp.BaseStaleness())
	static := !sp.Dynamic()
	var obs []psp.Observation
	type cand struct {
		p    peer.ID
		step int64 // -1: never seen
	}
	var ask []cand
	for _, p := range n.ov.Peers() {
		s, seen := n.progress.known(p)
		if static && seen && s >= threshold {
			obs = append(obs, psp.Observation{Peer: string(p), Step: s})
			continue
		}
		if !seen {
			s = -1
		}
		ask = append(ask, cand{p, s})
	}
	n.m.cached.Add(float64(len(obs)))
	slices.SortStableFunc(ask, func(a, b cand) int { return cmp.Compare(a.step, b.step) })
	peers := make([]peer.ID, len(ask))
	for i, c := range ask {
		peers[i] = c.p
	}
	c.asked = n.askBounded(ctx, peers, req, n.cfg.GlobalQueries, func(p peer.ID, a answer) bool {
		if a.err != nil {
			return false // marked dead by its goroutine
		}
		c.answered++
		o, ok := n.judge(ctx, p, a)
		if !ok {
			return false
		}
		obs = append(obs, o)
		if static && psp.Behind(req.Step, sp.BaseStaleness(), o.Step) {
			n.m.earlyFail.Inc()
			return true
		}
		return false
	})
	c.obs = obs
	return c
}

// askBounded asks peers for their steps, in order, with at most limit
// queries in flight (0: no limit), and hands each answer to take on the
// calling goroutine, until take returns true or every peer has answered
// or failed. A failed query marks its peer dead on its own goroutine (so
// that a query the caller stopped waiting for still does); take sees the
// failure too. Queries still in flight when askBounded returns run on to
// their own deadline, and their answers are dropped. It returns how many
// peers it asked.
func (n *Node) askBounded(ctx context.Context, peers []peer.ID, req StepRequest, limit int, take func(peer.ID, answer) bool) (asked int) {
	if limit <= 0 {
		limit = len(peers)
	}
	results := make(chan peerAnswer, len(peers)) // every query can send without blocking
	next, inflight := 0, 0
	for {
		for inflight < limit && next < len(peers) {
			p := peers[next]
			next++
			inflight++
			go func() { // ends within the query timeout, or when ctx ends
				r, err := n.queryStep(ctx, p, req)
				if err != nil && ctx.Err() == nil {
					n.queryFailed(p)
				}
				results <- peerAnswer{p, answer{r, err}} // buffered: never blocks
			}()
		}
		if inflight == 0 {
			return next
		}
		var r peerAnswer
		select {
		case <-ctx.Done():
			return next
		case r = <-results:
		}
		inflight--
		if take(r.p, r.a) {
			if inflight > 0 {
				go n.lateAnswers(results, inflight)
			}
			return next
		}
	}
}

// lateAnswers takes in the k answers still to come on results after a
// check that stopped waiting for them: what they tell of their peers'
// steps and liveness still counts (a peer seen at a step is not asked
// again at the next check), but not at a barrier, so the screen (which
// only the Run goroutine uses) is not consulted.
func (n *Node) lateAnswers(results <-chan peerAnswer, k int) {
	for range k {
		r := <-results // every query sends, within its deadline
		switch {
		case r.a.err != nil: // marked dead by its goroutine
		case r.a.reply.Leaving:
			n.noteLeft(r.p)
			n.dropPeer(r.p)
		default:
			switch n.admit(r.p, r.a.reply.Ext, true) { // genesis.go
			case otherModel: // held out
				n.unheard(r.p)
				continue
			case otherFork: // alive, but its step is another lineage's
				n.noteHeard(r.p)
				n.ov.MarkAlive(r.p)
				continue
			}
			n.noteHeard(r.p)
			n.ov.MarkAlive(r.p)
			n.progress.saw(r.p, r.a.reply.Step)
		}
	}
}

// peerAnswer is one peer's answer to a step query.
type peerAnswer struct {
	p peer.ID
	a answer
}
