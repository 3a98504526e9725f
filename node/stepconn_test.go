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
			if s.Protocol() == a.stepID || s.Protocol() == a.stepExtID {
				out = append(out, s)
			}
		}
	}
	return out
}

// Step queries to one peer reuse one stream; a stream the answerer closed
// costs a retry on a fresh one, not a failed query; a leave notice and
// StepStreams = 0 do not keep streams.
func TestStepStreamReuse(t *testing.T) {
	vclock.Test(t, testStepStreamReuse)
}

func testStepStreamReuse(t *testing.T) {
	nodes := memNodes(t, 2, "pssp:1:1", 0.001)
	a, b := nodes[0], nodes[1]
	ctx := t.Context()
	query := func() {
		t.Helper()
		if _, err := a.queryStep(ctx, b.ID(), wire.StepRequest{Step: 1}); err != nil {
			t.Fatalf("query: %v", err)
		}
	}

	query()
	first := a.steps.idle[b.ID()]
	if first == nil {
		t.Fatal("no idle stream kept after a query")
	}
	for range 5 {
		query()
	}
	if got := a.steps.idle[b.ID()]; got == nil || got.s.ID() != first.s.ID() {
		t.Fatalf("the idle stream changed over five queries")
	}
	if got := len(stepStreamsTo(a, b)); got != 1 {
		t.Errorf("a holds %d step streams to b, want 1", got)
	}

	// b closes its end (as at its idle timeout): the next query retries.
	for _, s := range stepStreamsTo(b, a) {
		_ = s.Close()
	}
	synctest.Wait() // the close has reached a's end
	stale := counterValue(a.m.staleStreams)
	query()
	if got := counterValue(a.m.staleStreams) - stale; got != 1 {
		t.Errorf("stale-stream retries %v, want 1", got)
	}
	if counterValue(a.m.timeouts) != 0 {
		t.Errorf("a closed idle stream counted as a failed query")
	}

	// A leave notice neither takes nor keeps a stream.
	kept := a.steps.idle[b.ID()]
	if _, err := a.queryStep(ctx, b.ID(), wire.StepRequest{Step: 1, Leaving: true}); err != nil {
		t.Fatalf("leave notice: %v", err)
	}
	if a.steps.idle[b.ID()] != kept {
		t.Error("the leave notice used or replaced the idle stream")
	}

	// With StepStreams = 0 every query has its own stream.
	a.steps.close()
	a.steps = newStepStreams(0)
	query()
	if got := len(a.steps.idle); got != 0 {
		t.Errorf("StepStreams 0 kept %d idle streams", got)
	}
}

// A malformed request later on a reused stream is counted and the stream
// reset, like a malformed first request; the answerer goes on serving.
func TestStepStreamMalformedLaterRequest(t *testing.T) {
	vclock.Test(t, testStepStreamMalformedLaterRequest)
}

func testStepStreamMalformedLaterRequest(t *testing.T) {
	nodes := memNodes(t, 2, "pssp:1:1", 0.001)
	a, b := nodes[0], nodes[1]
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	s, err := a.Host().NewStream(ctx, b.ID(), a.stepID)
	if err != nil {
		t.Fatal(err)
	}
	st := newStepStream(s, false)
	if _, err := a.exchange(ctx, st, wire.StepRequest{Step: 1}, time.Now().Add(5*time.Second)); err != nil {
		t.Fatalf("first exchange: %v", err)
	}
	before := counterValue(b.m.malformed)
	if err := writeFrame(s, []byte{0xff, 0xff, 0xff}); err != nil {
		t.Fatal(err)
	}
	if _, err := readFrame(st.r, wire.MaxStepFrame); err == nil {
		t.Fatal("a malformed request got a reply")
	}
	if got := counterValue(b.m.malformed) - before; got != 1 {
		t.Errorf("malformed requests counted %v, want 1", got)
	}
	if _, err := a.queryStep(ctx, b.ID(), wire.StepRequest{Step: 1}); err != nil {
		t.Errorf("b stopped answering after a malformed request: %v", err)
	}
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
// keeps trying; see bootstrap.go); before the handlers waited, it reached
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
	cfg.QueryTimeout = 5 * time.Second
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
	if err := writeFrame(s, wire.MarshalStepRequest(wire.StepRequest{Step: 3})); err != nil {
		t.Fatal(err)
	}
	synctest.Wait() // the query has reached the handler, which waits for New
	select {
	case r := <-done:
		t.Fatalf("New returned (%v) while its bootstrap dial was held", r.err)
	default:
	}
	close(joiner.open)

	body, err := readFrame(bufio.NewReader(s), wire.MaxStepFrame)
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
