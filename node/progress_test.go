package node

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
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
