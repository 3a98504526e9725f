package node

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/pspnode/pspnode/psp"
)

func TestProgressSeen(t *testing.T) {
	g := newProgress()
	a, b := peer.ID("a"), peer.ID("b")
	g.saw(a, 5)
	g.saw(a, 3) // steps only grow: an older report does not lower it
	for _, tc := range []struct {
		p    peer.ID
		step int64
		want bool
	}{
		{a, 5, true},
		{a, 4, true},
		{a, 6, false},
		{b, 0, false}, // never seen
	} {
		if _, ok := g.atLeast(tc.p, tc.step); ok != tc.want {
			t.Errorf("atLeast(%s, %d) = %v, want %v", tc.p, tc.step, ok, tc.want)
		}
	}
	g.forget(a)
	if _, ok := g.atLeast(a, 0); ok {
		t.Error("forgotten peer still known")
	}
}

func TestProgressRelease(t *testing.T) {
	g := newProgress()
	now := time.Now()
	g.wait("w3", 3, now)
	g.wait("w5", 5, now)
	g.wait("old", 1, now.Add(-2*waiterTTL))
	g.wait("w3", 2, now) // a lower threshold does not release it early

	for _, tc := range []struct {
		step int64
		want []peer.ID
	}{
		{2, nil}, // nobody released; "old" expires
		{3, []peer.ID{"w3"}},
		{4, nil}, // w3 was released once only
		{9, []peer.ID{"w5"}},
	} {
		got := g.release(tc.step, now)
		slices.Sort(got)
		if !slices.Equal(got, tc.want) {
			t.Errorf("release(%d) = %v, want %v", tc.step, got, tc.want)
		}
	}
	if len(g.waiters) != 0 {
		t.Errorf("waiters left: %v", g.waiters)
	}
}

func TestProgressBounded(t *testing.T) {
	g := newProgress()
	now := time.Now()
	for i := range 2 * maxWaiters {
		g.wait(peer.ID(fmt.Sprint(i)), 1, now)
	}
	if len(g.waiters) != maxWaiters {
		t.Fatalf("%d waiters held, want the cap %d", len(g.waiters), maxWaiters)
	}
	if got := g.release(1, now); len(got) != maxWaiters {
		t.Fatalf("released %d of %d waiters, want all", len(got), maxWaiters)
	}
}

// TestPollMax checks the backoff cap: PollMax for global barriers and with
// PollShare off, PollShare × mean compute time for sampled ones, clamped to
// [PollMin, PollMax].
func TestPollMax(t *testing.T) {
	tests := []struct {
		barrier string
		share   float64
		compute float64 // seconds
		want    time.Duration
	}{
		{"bsp", 1.0 / 32, 2, 500 * time.Millisecond},
		{"ssp:4", 1.0 / 32, 2, 500 * time.Millisecond},
		{"pbsp:10", 1.0 / 64, 2, 31250 * time.Microsecond},
		{"pbsp:10", DefaultConfig().PollShare, 2, 62500 * time.Microsecond},
		{"pssp:10:4", 1.0 / 32, 2, 62500 * time.Microsecond},
		{"pssp:10:4", 0, 2, 500 * time.Millisecond},
		{"pssp:10:4", 1.0 / 32, 0, 10 * time.Millisecond},   // no step yet: PollMin
		{"pssp:10:4", 1.0 / 32, 60, 500 * time.Millisecond}, // slow steps: PollMax
	}
	for _, tc := range tests {
		cfg := DefaultConfig()
		cfg.Barrier, cfg.PollShare = psp.MustParse(tc.barrier), tc.share
		n := &Node{cfg: cfg}
		noteEWMA(&n.compute, tc.compute)
		if got := n.pollMax(); got != tc.want {
			t.Errorf("%s, share %v, compute %v s: pollMax = %v, want %v", tc.barrier, tc.share, tc.compute, got, tc.want)
		}
	}
}
