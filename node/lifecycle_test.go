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

// Close stops Run: it returns ErrClosed, and the node takes no step
// after Close has returned. (Before, Run stepped on with no barrier: the
// closed overlay's empty sample passed every check.)
func TestCloseStopsRun(t *testing.T) {
	vclock.Test(t, func(t *testing.T) {
		nodes := memNodes(t, 3, "pssp:2:1", 0.01)
		ctx, cancel := context.WithCancel(t.Context())
		wait := runAll(t, ctx, nodes[1:])
		defer func() { cancel(); wait() }()
		victim := nodes[0]
		done := runOne(ctx, victim)
		if !waitFor(20*time.Second, func() bool { return victim.Step() >= 5 }) {
			t.Fatalf("the node did not train: step %d", victim.Step())
		}
		if err := victim.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		at := victim.Step()
		select {
		case err := <-done:
			if !errors.Is(err, ErrClosed) {
				t.Errorf("Run after Close returned %v, want ErrClosed", err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("Run still running 30 s after Close, at step %d (closed at %d)", victim.Step(), at)
			cancel()
			<-done
		}
		if s := victim.Step(); s > at {
			t.Errorf("the node stepped from %d to %d after Close", at, s)
		}
		rctx, rcancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer rcancel()
		if err := victim.Run(rctx); !errors.Is(err, ErrClosed) {
			t.Errorf("Run on a closed node returned %v, want ErrClosed", err)
		}
	})
}

// Run stopped by its context returns nil, even if the node is closed
// afterwards.
func TestRunStoppedByContextReturnsNil(t *testing.T) {
	vclock.Test(t, func(t *testing.T) {
		nodes := memNodes(t, 2, "pssp:1:1", 0.01)
		ctx, cancel := context.WithCancel(t.Context())
		wait := runAll(t, ctx, nodes[1:])
		defer func() { cancel(); wait() }()
		rctx, stop := context.WithCancel(ctx)
		done := runOne(rctx, nodes[0])
		if !waitFor(20*time.Second, func() bool { return nodes[0].Step() >= 3 }) {
			t.Fatal("the node did not train")
		}
		stop()
		if err := <-done; err != nil {
			t.Errorf("Run stopped by its context returned %v, want nil", err)
		}
	})
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

// A driven node that leaves refuses its driver's barriers with ErrClosed.
func TestDriverBarrierAfterLeave(t *testing.T) {
	vclock.Test(t, func(t *testing.T) {
		mn := memnet.New(0)
		t.Cleanup(func() { _ = mn.Close() })
		nodes := buildTestNodesWith(t, 2, "pssp:1:1", 0.01, memHosts(t, mn), func(c *nodeSetup) { c.Driven = true })
		d, err := nodes[0].Driver()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := d.Begin(t.Context(), 0, nil); err != nil {
			t.Fatal(err)
		}
		d.Activate("test")
		if _, err := d.Barrier(t.Context(), 1); err != nil {
			t.Fatal(err)
		}
		if err := d.Done(1); err != nil {
			t.Fatal(err)
		}
		if err := nodes[0].Leave(time.Second); err != nil {
			t.Fatal(err)
		}
		if _, err := d.Barrier(t.Context(), 2); !errors.Is(err, ErrClosed) {
			t.Errorf("Barrier after Leave returned %v, want ErrClosed", err)
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
