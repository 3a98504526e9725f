package node

import (
	"context"
	"testing"

	"github.com/pspnode/pspnode/internal/vclock"
)

// A New that fails while building its host leaves nothing running: the
// connection manager's and resource manager's goroutines are stopped. In
// the bubble a leaked goroutine fails the test when the function returns.
func TestNewHostFailureLeaksNothing(t *testing.T) {
	vclock.Test(t, func(t *testing.T) {
		cfg := DefaultConfig()
		cfg.Job = "leak"
		cfg.Listen = []string{"/ip4/127.0.0.1/tcp/not-a-port"} // libp2p.New refuses it
		nd, err := New(context.Background(), cfg)
		if err == nil {
			nd.Close()
			t.Fatal("New accepted an unparsable listen address")
		}
	})
}

// A seeded node hands the overlay a seed of its own, derived from the
// node's seed (so a seeded testnet samples reproducibly); an explicit
// Overlay.Seed wins; an unseeded node leaves the overlay unseeded.
func TestOverlaySeedFromNodeSeed(t *testing.T) {
	seeded := func(node, ov uint64) uint64 {
		cfg := DefaultConfig()
		cfg.Seed, cfg.Overlay.Seed = node, ov
		return overlayConfig(cfg, nil).Seed
	}
	a, b := seeded(7, 0), seeded(8, 0)
	switch {
	case a == 0 || b == 0:
		t.Fatalf("seeded nodes gave the overlay seeds %d and %d, want non-zero", a, b)
	case a == 7:
		t.Error("the overlay got the node's own seed, not a stream of its own")
	case a == b:
		t.Errorf("node seeds 7 and 8 gave the same overlay seed %d", a)
	case seeded(7, 0) != a:
		t.Error("the overlay seed is not a function of the node seed")
	}
	if got := seeded(7, 99); got != 99 {
		t.Errorf("explicit Overlay.Seed 99 became %d", got)
	}
	if got := seeded(0, 0); got != 0 {
		t.Errorf("an unseeded node seeded its overlay with %d", got)
	}
	cfg := DefaultConfig()
	cfg.Job, cfg.Bootstrap = "j", []string{"/ip4/127.0.0.1/tcp/1/p2p/x"}
	if oc := overlayConfig(cfg, nil); oc.Job != "j" || len(oc.BootstrapAddrs) != 1 {
		t.Errorf("job %q, bootstrap %v: not passed through", oc.Job, oc.BootstrapAddrs)
	}
}
