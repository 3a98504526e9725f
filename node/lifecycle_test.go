package node

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/host"

	"github.com/pspnode/pspnode/internal/memnet"
	"github.com/pspnode/pspnode/internal/vclock"
	"github.com/pspnode/pspnode/internal/wire"
)

// runOne runs nd.Run(ctx) on a goroutine; the channel gets its result.
func runOne(ctx context.Context, nd *Node) <-chan error {
	done := make(chan error, 1)
	go func() { done <- nd.Run(ctx) }()
	return done
}

// leave (Leave's first half) tells the peers and stops Run but keeps the
// host: a peer that asks afterwards is answered "leaving", and the peers
// told hold the node dead. Close then closes the host (Leave does both);
// Leave after it is ErrClosed.
func TestLeaveThenClose(t *testing.T) {
	vclock.Test(t, func(t *testing.T) {
		nodes := memNodes(t, 3, "pssp:2:1", 0.01)
		ctx, cancel := context.WithCancel(t.Context())
		others := nodes[1:]
		wait := runAll(t, ctx, others)
		defer func() { cancel(); wait() }()
		victim := nodes[0]
		done := runOne(ctx, victim)
		if !waitFor(20*time.Second, func() bool { return minStep(nodes) >= 5 }) {
			t.Fatal("the nodes did not train")
		}
		if err := victim.leave(time.Second); err != nil {
			t.Fatalf("leave: %v", err)
		}
		if err := <-done; !errors.Is(err, ErrClosed) {
			t.Errorf("Run after Leave returned %v, want ErrClosed", err)
		}
		for _, nd := range others {
			if slices.Contains(nd.Overlay().Peers(), victim.ID()) {
				t.Errorf("%s still holds the node that left as live", nd.ID().ShortString())
			}
		}
		r, err := others[0].queryStep(t.Context(), victim.ID(), wire.StepRequest{Step: others[0].Step()})
		if err != nil || !r.Leaving {
			t.Errorf("a node that left but is not shut down answered %+v, %v; want the leaving flag", r, err)
		}
		if err := victim.Leave(time.Second); err != nil {
			t.Errorf("Leave after leave: %v", err)
		}
		if _, err := others[0].queryStep(t.Context(), victim.ID(), wire.StepRequest{}); err == nil {
			t.Error("a node shut down still answers step queries")
		}
		if err := victim.Leave(time.Second); !errors.Is(err, ErrClosed) {
			t.Errorf("Leave after Close returned %v, want ErrClosed", err)
		}
	})
}

// closeSpy is a host that records whether it was closed.
type closeSpy struct {
	host.Host
	closed atomic.Bool
}

func (h *closeSpy) Close() error {
	h.closed.Store(true)
	return h.Host.Close()
}

// New owns a caller's host (WithHost) whatever happens: on a configuration it refuses
// (Validate) and on a failure after it has set the host up (here the
// overlay's), it closes the host before returning.
func TestNewFailureClosesCallersHost(t *testing.T) {
	for _, tc := range []struct {
		name    string
		breakIt func(*Config)
	}{
		{"invalid config", func(c *Config) { c.PSK = make([]byte, 32) }}, // a swarm key needs a host the node builds
		{"driven without a model", func(c *Config) { c.Driven = true }},  // WithModel is missing
		{"overlay fails", func(c *Config) { c.Overlay.BucketSize = 0 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vclock.Test(t, func(t *testing.T) {
				mn := memnet.New(0)
				t.Cleanup(func() { _ = mn.Close() })
				h, err := mn.NewHost(10, 20)
				if err != nil {
					t.Fatal(err)
				}
				spy := &closeSpy{Host: h}
				cfg := DefaultConfig()
				cfg.Job = "own"
				tc.breakIt(&cfg)
				nd, err := New(t.Context(), cfg, WithHost(spy))
				if err == nil {
					nd.Close()
					t.Fatal("New succeeded")
				}
				if !spy.closed.Load() {
					t.Errorf("New failed (%v) and left the caller's host open", err)
				}
			})
		})
	}
}
