package node

import (
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"

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
			c.MaxStreamsPerPeer, c.MaxInboundStreams = 8, 16
		})
		target := nodes[0]
		var held []network.Stream
		for _, nd := range nodes[1:] {
			for range 8 {
				s, err := nd.Host().NewStream(t.Context(), target.ID(), target.modelID)
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

// blockingStream is a step stream whose Close and Reset block until
// release is closed, as on a congested connection.
type blockingStream struct {
	network.Stream
	entered chan struct{} // closed when Close or Reset is first called
	release chan struct{}
	once    sync.Once
}

func (s *blockingStream) block() error {
	s.once.Do(func() { close(s.entered) })
	<-s.release
	return nil
}
func (s *blockingStream) Close() error { return s.block() }
func (s *blockingStream) Reset() error { return s.block() }

// A stream that blocks as it is closed or reset holds up only its own
// peer: the idle set serves other peers meanwhile. (It closed and reset
// streams under its lock, so one congested peer stalled every query.)
func TestStepStreamsDoNotBlockOnOnePeer(t *testing.T) {
	for _, tc := range []struct {
		name string
		stop func(ss *stepStreams, p peer.ID, st *stepStream)
	}{
		{"drop", func(ss *stepStreams, p peer.ID, _ *stepStream) { ss.drop(p) }},
		{"expired on take", func(ss *stepStreams, p peer.ID, _ *stepStream) { ss.take(p, time.Now().Add(time.Hour)) }},
		{"full on put", func(ss *stepStreams, p peer.ID, st *stepStream) { ss.put(p, st, time.Now()) }},
		{"close", func(ss *stepStreams, _ peer.ID, _ *stepStream) { ss.close() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ss := newStepStreams(1)
			slow, other := peer.ID("slow"), peer.ID("other")
			bs := &blockingStream{entered: make(chan struct{}), release: make(chan struct{})}
			st := &stepStream{s: bs}
			ss.put(slow, st, time.Now())
			stopped := make(chan struct{})
			go func() {
				defer close(stopped)
				tc.stop(ss, slow, st) // blocks in the stream's Close or Reset
			}()
			<-bs.entered
			done := make(chan struct{})
			go func() {
				defer close(done)
				ss.take(other, time.Now())
				ss.drop(other)
			}()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Error("the idle set stalled on another peer's stream close for 10 s")
			}
			close(bs.release)
			<-stopped
			<-done
		})
	}
}

// A global barrier's check has at most Config.GlobalQueries (32) step
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
				if s, ok := nd.progress.known(checker.ID()); ok && s == 3 {
					k++
					nd.progress.forget(checker.ID())
				}
			}
			return k
		}
		for i := range 3 {
			obs := checker.observe(t.Context())
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
