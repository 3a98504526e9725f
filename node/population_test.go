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

// The population is a weighted lower median of every peer's latest
// report and the node's own estimate: a peer that reports again and again
// is one vote, two liars beside two honest reports do not set it halfway,
// and a report far from it counts as a hostile message.
func TestPopulationVotes(t *testing.T) {
	vclock.Test(t, func(t *testing.T) {
		mn := memnet.New(0)
		t.Cleanup(func() { _ = mn.Close() })
		n := buildTestNodes(t, 1, "asp", 0, memHosts(t, mn))[0]
		note := func(p peer.ID, v float64) {
			n.ov.ObserveEstimate(p, v)
			n.pop.NotePeerEstimate(v)
		}
		a, b, liar, liar2 := peer.ID("a"), peer.ID("b"), peer.ID("liar"), peer.ID("liar2")
		note(a, 50)
		note(b, 52)
		n.pop.Repopulate()
		if got := n.pop.Population(); got != 1 {
			t.Fatalf("a node alone with two reports: population %v, want itself, 1", got)
		}
		for range 100 { // one peer, many reports: one vote
			note(liar, 1e6)
		}
		n.pop.Repopulate()
		if got := n.pop.Population(); got != 52 {
			t.Errorf("median of 50, 52, 1e6 = %v; want 52", got)
		}
		note(liar2, 1e6)
		n.pop.Repopulate()
		if got := n.pop.Population(); got != 52 {
			t.Errorf("lower median of 50, 52, 1e6, 1e6 = %v; want 52 (not the mean of 52 and 1e6)", got)
		}
		for _, v := range []float64{0, -3, 2e9} { // nonsense is ignored
			note(peer.ID("c"), v)
		}
		n.pop.Repopulate()
		if got := n.pop.Population(); got != 52 {
			t.Errorf("nonsense moved the population to %v", got)
		}
		// Three nonsense reports, and the lies made after the population
		// was 52.
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
			nd.pop.estMu.Lock()
			nd.pop.estAt, nd.pop.estVal = time.Now().Add(time.Hour), pop // held for the test
			nd.pop.estMu.Unlock()
		}

		// As in a testnet, the joiner knows the running nodes (it
		// bootstrapped from three); its overlay has no estimate worth the
		// name yet.
		for len(joiner.Overlay().Peers()) < len(running) {
			time.Sleep(10 * time.Millisecond) // the bubble's clock: waits only for the overlay
		}
		joiner.join(t.Context())
		if got := joiner.pop.Population(); got < pop/2 || got > 2*pop {
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
		own, first := norm(step(ref, pop)), norm(step(joiner, joiner.pop.Population()))
		if bound := ref.cfg.Exchange.NormBound; first > bound*own {
			t.Errorf("a running node would refuse the joiner's first update: norm %.3g, its own %.3g, bound %v×", first, own, bound)
		}
	})
}
