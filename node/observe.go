package node

import (
	"context"
	"errors"
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
	if f := n.cfg.faults.OnSample; f != nil && len(peers) > 0 {
		f(peers)
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
	delay := n.timing().hedge
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
	switch n.admit(p, a.reply.Ext, false) { // genesis.go
	case otherModel: // held out
		return psp.Observation{}, false
	case otherFork: // alive, but its step is another lineage's
		n.ov.MarkAlive(p)
		return psp.Observation{}, false
	}
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
