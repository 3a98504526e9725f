package e2e

import (
	"bufio"
	"context"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/pspnode/pspnode/internal/memnet"
	"github.com/pspnode/pspnode/internal/vclock"
	"github.com/pspnode/pspnode/internal/wire"
	"github.com/pspnode/pspnode/node"
	"github.com/pspnode/pspnode/node/status"
)

// One peer that sends each of three honest nodes 20 step queries a second,
// each reporting a population of 1e9, moves no honest node's population
// (the one its learning rate and /status use) nor its overlay's estimate
// above 10, and every one of its reports is counted as an outlier. A node
// that kept the last 32 reports it heard, whoever sent them, heard mostly
// the liar and took 1e9.
func TestEstimateLiarAmongThree(t *testing.T) {
	vclock.Test(t, func(t *testing.T) {
		mn := memnet.New(0)
		t.Cleanup(func() { _ = mn.Close() })
		nodes := memNodesOn(t, mn, 3, "pssp:2:2", 0.05, nil)
		liar, err := mn.NewHost(10, 20)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = liar.Close() })
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		defer cancel()
		wait := runAll(t, ctx, nodes)
		var lies sync.WaitGroup
		answered := make([]int, len(nodes))
		for i, nd := range nodes {
			lies.Go(func() { answered[i] = lieAbout(ctx, liar, nd, 1e9, 20) })
		}
		var worst, worstOverlay float64
		tick := time.NewTicker(250 * time.Millisecond)
		for ctx.Err() == nil {
			select {
			case <-ctx.Done():
			case <-tick.C:
			}
			for _, nd := range nodes {
				worst = max(worst, nd.Population())
				if est, _, err := nd.Overlay().Estimate(); err == nil {
					worstOverlay = max(worstOverlay, est)
				}
			}
		}
		tick.Stop()
		lies.Wait()
		wait()
		for i, k := range answered {
			if k < 200 {
				t.Errorf("node %d answered %d lying queries in 20 s, want about 400", i, k)
			}
		}
		if worst > 10 || worstOverlay > 10 {
			t.Errorf("largest population used %.4g, largest overlay estimate %.4g: want at most 10 beside one liar", worst, worstOverlay)
		}
		for i, nd := range nodes {
			if got := metric(t, nd.Registry(), "psp_hostile_messages_total", "kind", status.KindPopulationOutlier); got < float64(answered[i])/2 {
				t.Errorf("node %d counted %v outlying reports of %d lies", i, got, answered[i])
			}
		}
	})
}

// lieAbout sends nd rate step queries a second, each reporting estimate,
// on one stream while it lasts, until ctx ends; it returns how many were
// answered.
func lieAbout(ctx context.Context, h host.Host, nd *node.Node, estimate float64, rate int) (answered int) {
	if err := h.Connect(ctx, peer.AddrInfo{ID: nd.ID(), Addrs: nd.Host().Addrs()}); err != nil {
		return 0
	}
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	for ctx.Err() == nil {
		s, err := h.NewStream(ctx, nd.ID(), wire.StepProtocol("nodetest"))
		if err != nil {
			continue
		}
		r := bufio.NewReader(s)
		for ctx.Err() == nil {
			if wire.WriteFrame(s, wire.MarshalStepRequest(wire.StepRequest{Step: nd.Step(), Estimate: estimate})) != nil {
				break
			}
			if _, err := wire.ReadFrame(r, wire.MaxStepFrame); err != nil {
				break
			}
			answered++
			select {
			case <-ctx.Done():
			case <-tick.C:
			}
		}
		_ = s.Reset()
	}
	return answered
}
