package node

import (
	"bufio"
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/pspnode/pspnode/internal/memnet"
	"github.com/pspnode/pspnode/internal/vclock"
	"github.com/pspnode/pspnode/internal/wire"
)

// stepStreamsTo lists the open step streams (either version) a's host has
// with b.
func stepStreamsTo(a, b *Node) []network.Stream {
	var out []network.Stream
	for _, c := range a.Host().Network().ConnsToPeer(b.ID()) {
		for _, s := range c.GetStreams() {
			if s.Protocol() == wire.StepProtocol(a.cfg.Job) || s.Protocol() == wire.StepProtocolExt(a.cfg.Job) {
				out = append(out, s)
			}
		}
	}
	return out
}

// gatedHost holds every Connect (the dial to the bootstrap peers, inside
// New) until open is closed, then fails it with err if set.
type gatedHost struct {
	host.Host
	open chan struct{}
	err  error
}

func (h *gatedHost) Connect(ctx context.Context, ai peer.AddrInfo) error {
	select {
	case <-h.open:
	case <-ctx.Done():
		return ctx.Err()
	}
	if h.err != nil {
		return h.err
	}
	return h.Host.Connect(ctx, ai)
}

// TestStepQueryWhileJoining sends a step query to a node whose New is still
// joining the overlay: peers can find a joining node in the DHT and query it
// before New returns. The query must wait for the node and get a proper
// answer, also when the join fails (New then starts the node alone and
// keeps trying; see overlay.Config.KeepJoining); before the handlers waited, it reached
// a node without an overlay and crashed the process (a 200-node churn
// testnet, 2026-11-22).
func TestStepQueryWhileJoining(t *testing.T) {
	for _, tc := range []struct {
		name    string
		joinErr error // what the bootstrap dial returns
	}{
		{"join succeeds", nil},
		{"join fails", errors.New("bootstrap unreachable")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vclock.Test(t, func(t *testing.T) { testStepQueryWhileJoining(t, tc.joinErr) })
		})
	}
}

func testStepQueryWhileJoining(t *testing.T, joinErr error) {
	mn := memnet.New(0)
	t.Cleanup(func() { _ = mn.Close() })
	mk := memHosts(t, mn)
	boot := buildTestNodes(t, 1, "pssp:1:1", 0.001, mk)[0]
	asker := mk()
	t.Cleanup(func() { _ = asker.Close() }) // mn.Close leaves a host's connection manager running
	joiner := &gatedHost{Host: mk(), open: make(chan struct{}), err: joinErr}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()

	cfg := DefaultConfig()
	cfg.Job = "nodetest"
	cfg.Bootstrap = []string{boot.Addrs()[0].String()}
	cfg.Check.QueryTimeout = 5 * time.Second
	type result struct {
		nd  *Node
		err error
	}
	done := make(chan result, 1)
	go func() {
		nd, err := New(context.Background(), cfg, WithHost(joiner))
		done <- result{nd, err}
	}()

	// The step handler is registered at once; New then waits at the gate.
	var s network.Stream
	for {
		var err error
		s, err = asker.NewStream(ctx, joiner.ID(), wire.StepProtocol(cfg.Job))
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("no step handler on the joining node: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	defer func() { _ = s.Reset() }()
	if err := wire.WriteFrame(s, wire.MarshalStepRequest(wire.StepRequest{Step: 3})); err != nil {
		t.Fatal(err)
	}
	synctest.Wait() // the query has reached the handler, which waits for New
	select {
	case r := <-done:
		t.Fatalf("New returned (%v) while its bootstrap dial was held", r.err)
	default:
	}
	close(joiner.open)

	body, err := wire.ReadFrame(bufio.NewReader(s), wire.MaxStepFrame)
	r := <-done
	if r.nd != nil {
		t.Cleanup(func() { r.nd.Close() })
	}
	if r.err != nil {
		t.Fatalf("New: %v", r.err)
	}
	if err != nil {
		t.Fatalf("no answer from a joining node: %v", err)
	}
	if _, err := wire.UnmarshalStepReply(body); err != nil {
		t.Fatalf("bad answer from a joining node: %v", err)
	}
	if joinErr != nil && r.nd.Status().Joined {
		t.Error("a node whose bootstrap is unreachable says it joined")
	}
}
