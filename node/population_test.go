package node

import (
	"math"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"gonum.org/v1/gonum/floats"

	"github.com/pspnode/pspnode/internal/memnet"
	"github.com/pspnode/pspnode/internal/vclock"
	"github.com/pspnode/pspnode/node/status"
)

// The reported population is the median of every peer's latest report,
// one vote per peer: a peer that reports again and again is one vote, and
// a report far from the others counts as a hostile message.
func TestReportedPopulation(t *testing.T) {
	vclock.Test(t, func(t *testing.T) {
		mn := memnet.New(0)
		t.Cleanup(func() { _ = mn.Close() })
		n := buildTestNodes(t, 1, "asp", 0, memHosts(t, mn))[0]
		note := func(p peer.ID, v float64) {
			n.ov.ObserveEstimate(p, v)
			n.notePeerEstimate(v)
		}
		a, b, liar := peer.ID("a"), peer.ID("b"), peer.ID("liar")
		note(a, 50)
		note(b, 52)
		if _, ok := n.reportedPopulation(); ok {
			t.Fatal("a median from two peers")
		}
		for range 100 { // one peer, many reports: one vote
			note(liar, 1e6)
		}
		if got, ok := n.reportedPopulation(); !ok || got != 52 {
			t.Errorf("median of 50, 52, 1e6 = %v, %v; want 52", got, ok)
		}
		for _, v := range []float64{0, -3, 2e9} { // nonsense is ignored
			note(peer.ID("c"), v)
		}
		if got, _ := n.reportedPopulation(); got != 52 {
			t.Errorf("nonsense moved the median to %v", got)
		}
		time.Sleep(reportedMedianTTL) // the cached median is the one above
		note(liar, 1e6)
		// Three nonsense reports, and at least the last lie (the median
		// was cached before the lies began).
		if got := status.CounterValue(n.m.Hostile.WithLabelValues(status.KindPopulationOutlier)); got < 4 {
			t.Errorf("%v reports counted as outliers, want at least 4", got)
		}
	})
}

// A joiner's first update must pass its peers' norm bound. Its overlay knows
// only a few peers at its first step and estimates a tiny population, so it
// used to scale its learning rate by 1/4 where its peers used 1/50, and its
// first update, many times theirs, was refused by all of them. Now the
// estimates its peers report when it asks their steps on joining set its
// population, and its first update is of the size of theirs.
func TestJoinerFirstUpdateWithinPeersBound(t *testing.T) {
	vclock.Test(t, func(t *testing.T) {
		mn := memnet.New(0)
		t.Cleanup(func() { _ = mn.Close() })
		nodes := buildTestNodes(t, 4, "pssp:1:1", 0, memHosts(t, mn))
		running, joiner := nodes[:3], nodes[3]
		const pop = 50 // what the running nodes estimate and report
		for _, nd := range running {
			nd.step.Store(100)
			nd.estMu.Lock()
			nd.estAt, nd.estVal = time.Now().Add(time.Hour), pop // held for the test
			nd.estMu.Unlock()
		}

		// As in a testnet, the joiner knows the running nodes (it
		// bootstrapped from three); its overlay has no estimate worth the
		// name yet.
		for len(joiner.Overlay().Peers()) < len(running) {
			time.Sleep(10 * time.Millisecond) // the bubble's clock: waits only for the overlay
		}
		joiner.join(t.Context())
		if got := joiner.population(); got < pop/2 || got > 2*pop {
			t.Errorf("joiner's population %v, want about the %v its peers report", got, pop)
		}

		// One step each from the same model (the joiner fetched it), each
		// at its own population, as Run does.
		step := func(nd *Node, pop float64) []float64 {
			nd.model.(PopulationAware).SetPopulation(pop)
			upd, err := nd.work.Step(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			return upd
		}
		// The running node's norm bound, with its one step as its
		// reference (package exchange: the upper quartile of its own).
		ref := running[0]
		norm := func(v []float64) float64 { return math.Sqrt(floats.Dot(v, v)) }
		own, first := norm(step(ref, pop)), norm(step(joiner, joiner.population()))
		if bound := ref.cfg.Exchange.NormBound; first > bound*own {
			t.Errorf("a running node would refuse the joiner's first update: norm %.3g, its own %.3g, bound %v×", first, own, bound)
		}
	})
}
