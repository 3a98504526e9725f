package node

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pspnode/pspnode/internal/builtin"
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

// New checks what its options and the configuration must agree on, naming
// the option or the field: a driven node needs WithTask; a node needs a
// listen address or WithHost; a swarm key or an allowlist needs a host the
// node builds.
func TestOptionsAgreeWithConfig(t *testing.T) {
	given := &closeSpy{} // any host will do: nothing runs
	for _, tc := range []struct {
		name string
		set  func(*Config)
		opts []Option
		want string // in the error; "" for none
	}{
		{"defaults", func(*Config) {}, nil, ""},
		{"driven with a model", func(c *Config) { c.Driven = true }, []Option{WithModel(builtin.NewSleepTask(builtin.TimeModel{}, 1))}, ""},
		{"driven without a model", func(c *Config) { c.Driven = true }, nil, "WithModel: a driven node"},
		{"driven with a task", func(c *Config) { c.Driven = true }, []Option{WithModel(noWork{}), WithTask(noWork{})}, "WithTask: a driven node (Driven) runs no task"},
		{"a bare model, not driven", func(*Config) {}, []Option{WithModel(noWork{})}, "WithModel: only a driven node"},
		{"no listen address", func(c *Config) { c.Listen = nil }, nil, "Listen: no listen address, and no host (WithHost)"},
		{"a host instead", func(c *Config) { c.Listen = nil }, []Option{WithHost(given)}, ""},
		{"swarm key with a host", func(c *Config) { c.PSK = make([]byte, 32) }, []Option{WithHost(given)}, "PSK, AllowPeers: "},
		{"allowlist with a host", func(c *Config) { c.AllowPeers = []peer.ID{"x"} }, []Option{WithHost(given)}, "PSK, AllowPeers: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			tc.set(&cfg)
			var d deps
			for _, o := range tc.opts {
				o(&d)
			}
			err := errors.Join(d.validate(cfg)...)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want one with %q", err, tc.want)
			}
		})
	}
	// The options set what they name; a later one of a kind wins.
	log, reg := slog.New(slog.DiscardHandler), prometheus.NewRegistry()
	a, b := builtin.NewSleepTask(builtin.TimeModel{}, 1), builtin.NewSleepTask(builtin.TimeModel{}, 2)
	var d deps
	for _, o := range []Option{WithTask(a), WithHost(given), WithLogger(log), WithRegistry(reg), WithTask(b), WithModel(a)} {
		o(&d)
	}
	if d.task != b || d.model != a || d.host != given || d.log != log || d.reg != reg {
		t.Errorf("options set %+v", d)
	}
}
