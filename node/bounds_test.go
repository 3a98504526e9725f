package node

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/libp2p/go-libp2p/core/network"

	"github.com/pspnode/pspnode/internal/memnet"
	"github.com/pspnode/pspnode/internal/vclock"
	"github.com/pspnode/pspnode/internal/wire"
)

// Slow model streams do not crowd out step queries. Two peers each hold
// eight model streams open on the first node, announcing a request and
// never sending it (a stream may rightly last 10 × QueryTimeout). With
// the step protocol's caps at 8 per peer and 16 in all, a shared limiter
// was full: every step query was refused and the askers took the node
// for dead. The model protocol has caps of its own.
func TestSlowModelStreamsLeaveStepQueries(t *testing.T) {
	vclock.Test(t, func(t *testing.T) {
		mn := memnet.New(0)
		t.Cleanup(func() { _ = mn.Close() })
		nodes := buildTestNodesWith(t, 3, "asp", 0.01, memHosts(t, mn), func(c *nodeSetup) {
			c.Limits.MaxStreamsPerPeer, c.Limits.MaxInboundStreams = 8, 16
		})
		target := nodes[0]
		var held []network.Stream
		for _, nd := range nodes[1:] {
			for range 8 {
				s, err := nd.Host().NewStream(t.Context(), target.ID(), wire.ModelProtocol(target.cfg.Job))
				if err != nil {
					t.Fatal(err)
				}
				_, _ = s.Write([]byte{1}) // a frame of one byte is coming; it never does
				held = append(held, s)
			}
		}
		synctest.Wait() // the target's handlers hold every stream they took
		for _, nd := range nodes[1:] {
			if _, err := nd.queryStep(t.Context(), target.ID(), wire.StepRequest{Step: 1}); err != nil {
				t.Errorf("%s's step query refused while slow model streams are open: %v", nd.ID().ShortString(), err)
			}
		}
		if got := target.Status().StreamsRefused; got == 0 {
			t.Error("no model stream over the model protocol's caps was refused")
		}
		for _, s := range held {
			_ = s.Reset()
		}
	})
}

// A global barrier's check has at most Config.Check.GlobalQueries (32) step
// queries in flight, and a BSP check ends at the first peer behind it.
// Thirty-nine peers at step 0 and a node at step 3: the check fails, and
// before, it asked all thirty-nine at once, every check.
func TestGlobalCheckBounded(t *testing.T) {
	vclock.Test(t, func(t *testing.T) {
		mn := memnet.New(0)
		t.Cleanup(func() { _ = mn.Close() })
		const n = 40
		nodes := buildTestNodesWith(t, n, "bsp", 0.01, memHosts(t, mn), func(c *nodeSetup) { c.WaitPeers = 0 })
		checker := nodes[0]
		if !waitFor(time.Minute, func() bool { return checker.Overlay().PeerCount() == n-1 }) {
			t.Fatalf("the checker knows %d of %d peers", checker.Overlay().PeerCount(), n-1)
		}
		checker.step.Store(3)
		asked := func() int { // peers that have heard a query from the checker at step 3
			k := 0
			for _, nd := range nodes[1:] {
				if s, ok := nd.bar.Progress().Known(checker.ID()); ok && s == 3 {
					k++
					nd.bar.Progress().Forget(checker.ID())
				}
			}
			return k
		}
		for i := range 3 {
			obs := checker.bar.Observe(t.Context())
			if d := checker.decider.Decide(3, 0, obs); d.Pass {
				t.Fatalf("check %d passed with every peer 3 steps behind", i)
			}
			synctest.Wait() // queries the check no longer waited for are answered
			if k := asked(); k > 32 {
				t.Errorf("check %d asked %d peers, want at most 32 (the queries in flight at once)", i, k)
			}
		}
	})
}
