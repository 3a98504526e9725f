package node

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/pspnode/pspnode/internal/memnet"
	"github.com/pspnode/pspnode/internal/vclock"
	"github.com/pspnode/pspnode/internal/wire"
	"github.com/pspnode/pspnode/node/status"
)

// Eighty peers that each hold eight idle step streams on a node (640, over
// its 512 inbound slots: each opens a stream, sends nothing, and opens
// another as soon as the node resets it) do not keep the node's known
// peers from asking its step: every one of their queries is answered.
// Before, the hogs filled every slot and 8 of 8 honest queries were reset.
func TestStepStreamHogs(t *testing.T) {
	vclock.Test(t, func(t *testing.T) {
		mn := memnet.New(0)
		t.Cleanup(func() { _ = mn.Close() })
		nodes := buildTestNodes(t, 3, "asp", 0.001, memHosts(t, mn))
		target := nodes[0]
		if !waitFor(10*time.Second, func() bool { return len(target.Overlay().Peers()) >= 2 }) {
			t.Fatalf("the target knows %d peers, want 2", len(target.Overlay().Peers()))
		}
		ctx, cancel := context.WithCancel(t.Context())
		var wg sync.WaitGroup
		for range 80 {
			h, err := mn.NewHost(10, 20)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = h.Close() })
			if err := h.Connect(ctx, peer.AddrInfo{ID: target.ID(), Addrs: target.Host().Addrs()}); err != nil {
				t.Fatal(err)
			}
			for range target.cfg.Limits.MaxStreamsPerPeer {
				wg.Go(func() { holdStepStreams(ctx, h, target) })
			}
		}
		synctest.Wait() // the hogs hold their streams
		failed := 0
		for i := range 20 {
			for _, honest := range nodes[1:] {
				if _, err := honest.queryStep(t.Context(), target.ID(), wire.StepRequest{Step: 1}); err != nil {
					failed++
					t.Logf("query %d from %s: %v", i, honest.ID(), err)
				}
			}
			time.Sleep(100 * time.Millisecond)
		}
		cancel()
		wg.Wait()
		if failed > 0 {
			t.Errorf("%d of 40 honest step queries failed while 80 peers held idle step streams", failed)
		}
		if got := status.CounterValue(target.m.Hostile.WithLabelValues(status.KindStepStreamEvicted)); got == 0 {
			t.Error("no idle step stream evicted")
		}
	})
}

// holdStepStreams holds one idle step stream on nd, sending nothing, and
// opens another 20 ms after nd resets it, until ctx ends.
func holdStepStreams(ctx context.Context, h host.Host, nd *Node) {
	buf := make([]byte, 1)
	for ctx.Err() == nil {
		s, err := h.NewStream(ctx, nd.ID(), nd.stepExtID)
		if err != nil {
			vclock.Sleep(ctx, 20*time.Millisecond)
			continue
		}
		stop := context.AfterFunc(ctx, func() { _ = s.Reset() })
		_, _ = s.Read(buf) // until nd resets it
		stop()
		_ = s.Reset()
		vclock.Sleep(ctx, 20*time.Millisecond)
	}
}
