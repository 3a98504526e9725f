package node

import (
	"context"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/pspnode/pspnode/internal/memnet"
	"github.com/pspnode/pspnode/internal/vclock"
	"github.com/pspnode/pspnode/internal/wire"
	"github.com/pspnode/pspnode/node/status"
)

// A peer that opens many step streams at once and never writes (a
// flooder) gets the streams over its cap reset, and an honest peer's query
// to the same node is still answered.
func TestStreamFloodIsCapped(t *testing.T) {
	vclock.Test(t, testStreamFloodIsCapped)
}

func testStreamFloodIsCapped(t *testing.T) {
	mn := memnet.New(0)
	t.Cleanup(func() { _ = mn.Close() })
	nodes := buildTestNodes(t, 2, "asp", 0.001, memHosts(t, mn))
	target, honest := nodes[0], nodes[1]
	flood, err := mn.NewHost(10, 20)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = flood.Close() })
	if err := flood.Connect(t.Context(), peer.AddrInfo{ID: target.ID(), Addrs: target.Host().Addrs()}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			s, err := flood.NewStream(ctx, target.ID(), wire.StepProtocol(target.cfg.Job))
			if err != nil {
				return
			}
			_, _ = s.Write([]byte{0xff}) // an unfinished frame, then silence
			<-ctx.Done()
			_ = s.Reset()
		})
	}
	synctest.Wait() // every flood stream is open, or reset
	if got, want := status.CounterValue(target.m.Refused.WithLabelValues("step")), 64-float64(target.cfg.Limits.MaxStreamsPerPeer); got < want {
		t.Errorf("refused %v flood streams, want at least %v", got, want)
	}
	r, err := honest.queryStep(t.Context(), target.ID(), wire.StepRequest{Step: 1})
	if err != nil {
		t.Fatalf("honest query during the flood failed: %v", err)
	}
	if r.Step != target.Step() {
		t.Errorf("honest query got step %d, want %d", r.Step, target.Step())
	}
	cancel()
	wg.Wait()
}

// A sampled barrier check does not wait for a slow peer: after the hedge
// delay it asks a fresh draw beside it and ends with the first β answers.
func TestObserveHedgesSlowPeer(t *testing.T) {
	vclock.Test(t, testObserveHedgesSlowPeer)
}

func testObserveHedgesSlowPeer(t *testing.T) {
	nodes := memNodes(t, 4, "pssp:2:1", 0.001)
	a, slow := nodes[0], nodes[2]
	slow.cfg.faults.ReplyDelay = time.Second
	a.cfg.Check.QueryTimeout = 3 * time.Second // without hedging, a would wait for the slow answer
	if !waitFor(10*time.Second, func() bool { return len(a.Overlay().Peers()) >= 3 }) {
		t.Fatalf("a knows %d peers, want 3", len(a.Overlay().Peers()))
	}
	sampledSlow := 0
	for i := 0; i < 100 && sampledSlow < 3; i++ {
		var drew []peer.ID
		a.cfg.faults.OnSample = func(ps []peer.ID) { drew = ps }
		start := time.Now()
		obs := a.bar.Observe(t.Context())
		if d := time.Since(start); d >= slow.cfg.faults.ReplyDelay {
			t.Fatalf("the check took %v, as long as the slow peer's reply", d)
		}
		if len(obs) != 2 {
			t.Fatalf("observe returned %d observations, want 2: %+v", len(obs), obs)
		}
		for _, o := range obs {
			if peer.ID(o.Peer) == slow.ID() {
				t.Fatal("the check waited for the slow peer's answer")
			}
		}
		if slices.Contains(drew, slow.ID()) {
			sampledSlow++
		}
	}
	if sampledSlow == 0 {
		t.Fatal("the slow peer was never sampled in 100 checks")
	}
	if status.CounterValue(a.m.Hedged) == 0 {
		t.Error("no query was hedged")
	}
}

// A pBSP check ends at the first sampled answer below its threshold: it
// has failed whatever the others say, so it does not wait for the slow
// ones. A check that can pass still waits for all β answers.
func TestObserveEndsAtFirstLaggard(t *testing.T) {
	vclock.Test(t, testObserveEndsAtFirstLaggard)
}

func testObserveEndsAtFirstLaggard(t *testing.T) {
	nodes := memNodes(t, 4, "pbsp:3", 0.001)
	a := nodes[0]
	// Slow, but within the 500 ms query timeout: the level check waits
	// for them.
	nodes[2].cfg.faults.ReplyDelay = 200 * time.Millisecond
	nodes[3].cfg.faults.ReplyDelay = 200 * time.Millisecond
	if !waitFor(10*time.Second, func() bool { return len(a.Overlay().Peers()) >= 3 }) {
		t.Fatalf("a knows %d peers, want 3", len(a.Overlay().Peers()))
	}
	tests := []struct {
		name    string
		step    int64 // a's step; the peers stay at 0
		wantObs int
		early   bool
	}{
		// Level first: the ahead case leaves the slow peers' queries
		// running, which would hold their inbound stream caps.
		{"level: passes on all three", 0, 3, false},
		{"ahead: fails at the first answer", 5, 1, true},
	}
	for _, tt := range tests {
		a.step.Store(tt.step)
		before := status.CounterValue(a.m.EarlyFail)
		start := time.Now()
		obs := a.bar.Observe(t.Context())
		took := time.Since(start)
		if len(obs) != tt.wantObs {
			t.Fatalf("%s: observe returned %d observations, want %d: %+v", tt.name, len(obs), tt.wantObs, obs)
		}
		if tt.early && peer.ID(obs[0].Peer) != nodes[1].ID() {
			t.Errorf("%s: the check ended on %s, want the fast peer %s", tt.name, obs[0].Peer, nodes[1].ID())
		}
		if slow := nodes[2].cfg.faults.ReplyDelay; (took >= slow) != !tt.early {
			t.Errorf("%s: the check took %v; the slow peers answer after %v", tt.name, took, slow)
		}
		if got := status.CounterValue(a.m.EarlyFail) - before; (got > 0) != tt.early {
			t.Errorf("%s: early-fail counter grew by %v, want growth %v", tt.name, got, tt.early)
		}
	}
}
