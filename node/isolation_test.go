package node

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/pspnode/pspnode/internal/memnet"
	"github.com/pspnode/pspnode/internal/vclock"
)

// isolatedGauge reads psp_isolated.
func isolatedGauge(t *testing.T, nd *Node) float64 {
	t.Helper()
	mf := families(t, nd)["psp_isolated"]
	if mf == nil || len(mf.GetMetric()) != 1 {
		t.Fatal("no psp_isolated gauge")
	}
	return mf.GetMetric()[0].GetGauge().GetValue()
}

// cutOff partitions nd from every other node of mn.
func cutOff(mn *memnet.Net, nd *Node) {
	mn.Partition(func(p peer.ID) int {
		if p == nd.ID() {
			return 1
		}
		return 0
	})
}

// A node cut off from all its peers stops training: every check hears
// from no one and fails, and it says so in /status, /health and
// psp_isolated. When the network heals it trains again. (Before, every
// query failed, every empty check passed, and it ran on with no barrier.)
func TestIsolatedNodeWaits(t *testing.T) {
	vclock.Test(t, func(t *testing.T) {
		mn := memnet.New(0)
		t.Cleanup(func() { _ = mn.Close() })
		nodes := buildTestNodesWith(t, 3, "pssp:2:1", 0.1, memHosts(t, mn), nil)
		ctx, cancel := context.WithCancel(t.Context())
		wait := runAll(t, ctx, nodes)
		defer func() { cancel(); wait() }()
		a, others := nodes[0], nodes[1:]
		if !waitFor(20*time.Second, func() bool { return minStep(nodes) >= 10 }) {
			t.Fatal("the nodes did not train")
		}
		if a.Status().Isolated || isolatedGauge(t, a) != 0 {
			t.Fatal("isolated while its peers answer")
		}
		cutOff(mn, a)
		if !waitFor(10*time.Second, func() bool { return a.Status().Isolated }) {
			t.Fatalf("not isolated 10 s after being cut off, at step %d (others at %d)", a.Step(), minStep(others))
		}
		at := a.Step()
		othersAt := minStep(others)
		if waitFor(20*time.Second, func() bool { return a.Step() > at+1 }) {
			t.Errorf("the cut-off node stepped on from %d to %d", at, a.Step())
		}
		if minStep(others) < othersAt+20 {
			t.Errorf("the other two stalled: %d then %d", othersAt, minStep(others))
		}
		st := a.Status()
		if !st.Isolated || st.IsolatedSince == "" || !st.Waiting || isolatedGauge(t, a) != 1 {
			t.Errorf("status isolated %v since %q waiting %v, psp_isolated %v", st.Isolated, st.IsolatedSince, st.Waiting, isolatedGauge(t, a))
		}
		if code, body := health(a); code != http.StatusServiceUnavailable || !strings.Contains(body, "isolated") {
			t.Errorf("/health of an isolated node: %d %q", code, body)
		}
		mn.Heal()
		if !waitFor(time.Minute, func() bool { return a.Step() >= at+10 }) {
			t.Fatalf("the node did not train again after the network healed: step %d (isolated %v)", a.Step(), a.Status().Isolated)
		}
		if a.Status().Isolated || isolatedGauge(t, a) != 0 {
			t.Error("still isolated after peers answered")
		}
		if code, _ := health(a); code != http.StatusOK {
			t.Errorf("/health after healing: %d", code)
		}
	})
}

// A node alone in its job (no peer at all) trains: a first node.
func TestAloneNodeTrains(t *testing.T) {
	vclock.Test(t, func(t *testing.T) {
		nodes := memNodes(t, 1, "pssp:2:1", 0.01)
		nodes[0].cfg.MaxSteps = 20
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		if err := nodes[0].Run(ctx); err != nil {
			t.Fatal(err)
		}
		if s := nodes[0].Step(); s != 20 {
			t.Errorf("a node alone reached step %d, want 20", s)
		}
		if nodes[0].Status().Isolated {
			t.Error("a node alone is reported isolated")
		}
	})
}

// A node whose every peer failed stays isolated until it forgets them
// (2 × Overlay.DeadHold), then takes them for gone and trains alone.
func TestIsolationEndsWhenFailedPeersForgotten(t *testing.T) {
	vclock.Test(t, func(t *testing.T) {
		mn := memnet.New(0)
		t.Cleanup(func() { _ = mn.Close() })
		nodes := buildTestNodesWith(t, 2, "pssp:1:1", 0.1, memHosts(t, mn), func(c *nodeSetup) { c.Overlay.DeadHold = 10 * time.Second })
		ctx, cancel := context.WithCancel(t.Context())
		wait := runAll(t, ctx, nodes)
		defer func() { cancel(); wait() }()
		a := nodes[0]
		if !waitFor(20*time.Second, func() bool { return minStep(nodes) >= 10 }) {
			t.Fatal("the nodes did not train")
		}
		cutOff(mn, a)
		if !waitFor(10*time.Second, func() bool { return a.Status().Isolated }) {
			t.Fatal("not isolated after being cut off")
		}
		cut := time.Now()
		if !waitFor(time.Minute, func() bool { return !a.Status().Isolated }) {
			t.Fatal("still isolated a minute after its only peer failed, with DeadHold 10 s")
		}
		if d := time.Since(cut); d < 15*time.Second {
			t.Errorf("isolation ended %v after the cut: before the failed peer was forgotten (20 s)", d)
		}
		at := a.Step()
		if !waitFor(20*time.Second, func() bool { return a.Step() >= at+10 }) {
			t.Errorf("the node did not train alone after forgetting its failed peer: step %d", a.Step())
		}
	})
}

// A driven node sees the same policy through Driver.Barrier: cut off, its
// barrier waits.
func TestDriverBarrierIsolated(t *testing.T) {
	vclock.Test(t, func(t *testing.T) {
		mn := memnet.New(0)
		t.Cleanup(func() { _ = mn.Close() })
		nodes := buildTestNodesWith(t, 3, "pssp:2:1", 0.01, memHosts(t, mn), func(c *nodeSetup) { c.Driven = true })
		type session struct {
			d    *Driver
			step int64
		}
		var ss []*session
		for _, nd := range nodes {
			d, err := nd.Driver()
			if err != nil {
				t.Fatal(err)
			}
			start, err := d.Begin(t.Context(), 0, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			d.Activate("test")
			ss = append(ss, &session{d, start.Step})
		}
		step := func(s *session, ctx context.Context) error {
			if _, err := s.d.Barrier(ctx, s.step+1); err != nil {
				return err
			}
			s.step++
			return s.d.Done(s.step)
		}
		for range 5 { // all together, a few steps
			for _, s := range ss {
				if err := step(s, t.Context()); err != nil {
					t.Fatal(err)
				}
			}
		}
		cutOff(mn, nodes[0])
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		var err error
		for err == nil {
			err = step(ss[0], ctx)
		}
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("a cut-off driven node's barrier ended with %v, want the caller's deadline", err)
		}
		if !nodes[0].Status().Isolated {
			t.Error("the cut-off driven node is not reported isolated")
		}
		// Answers already on their way when the network was cut may pass
		// a check or two; then it waits (before, it ran on unconstrained).
		if ss[0].step > 7 {
			t.Errorf("the cut-off driven node passed %d barriers after the cut", ss[0].step-5)
		}
	})
}
