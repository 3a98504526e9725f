package node

import (
	"context"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/network"

	"github.com/pspnode/pspnode/internal/memnet"
)

// stepStreamsTo lists the open step streams a's host has with b.
func stepStreamsTo(a, b *Node) []network.Stream {
	var out []network.Stream
	for _, c := range a.Host().Network().ConnsToPeer(b.ID()) {
		for _, s := range c.GetStreams() {
			if s.Protocol() == a.stepID {
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
	mn := memnet.New(0)
	t.Cleanup(func() { _ = mn.Close() })
	nodes := buildTestNodes(t, 2, "pssp:1:1", 0.001, memHosts(t, mn))
	a, b := nodes[0], nodes[1]
	ctx := context.Background()
	query := func() {
		t.Helper()
		if _, err := a.queryStep(ctx, b.ID(), StepRequest{Step: 1}); err != nil {
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
	time.Sleep(50 * time.Millisecond)
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
	if _, err := a.queryStep(ctx, b.ID(), StepRequest{Step: 1, Leaving: true}); err != nil {
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
	mn := memnet.New(0)
	t.Cleanup(func() { _ = mn.Close() })
	nodes := buildTestNodes(t, 2, "pssp:1:1", 0.001, memHosts(t, mn))
	a, b := nodes[0], nodes[1]
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := a.Host().NewStream(ctx, b.ID(), a.stepID)
	if err != nil {
		t.Fatal(err)
	}
	st := newStepStream(s)
	if _, err := a.exchange(ctx, st, StepRequest{Step: 1}); err != nil {
		t.Fatalf("first exchange: %v", err)
	}
	before := counterValue(b.m.malformed)
	if err := writeFrame(s, []byte{0xff, 0xff, 0xff}); err != nil {
		t.Fatal(err)
	}
	if _, err := readFrame(st.r, maxStepFrame); err == nil {
		t.Fatal("a malformed request got a reply")
	}
	if got := counterValue(b.m.malformed) - before; got != 1 {
		t.Errorf("malformed requests counted %v, want 1", got)
	}
	if _, err := a.queryStep(ctx, b.ID(), StepRequest{Step: 1}); err != nil {
		t.Errorf("b stopped answering after a malformed request: %v", err)
	}
}
