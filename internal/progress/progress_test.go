package progress

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/pspnode/pspnode/psp"
)

func TestProgressSeen(t *testing.T) {
	g := New()
	a, b := peer.ID("a"), peer.ID("b")
	g.Saw(a, 5)
	g.Saw(a, 3) // steps only grow: an older report does not lower it
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
		if _, ok := g.AtLeast(tc.p, tc.step); ok != tc.want {
			t.Errorf("atLeast(%s, %d) = %v, want %v", tc.p, tc.step, ok, tc.want)
		}
	}
	g.Forget(a)
	if _, ok := g.AtLeast(a, 0); ok {
		t.Error("forgotten peer still known")
	}
}

// A sampled check counts a peer without asking only on steps the peer gave
// in answer to this node's queries (vouch), and not while the screen holds
// its reports refused (distrust); a step a peer merely claimed (saw)
// serves the global barriers alone.
func TestProgressVouched(t *testing.T) {
	now := time.Now()
	a, b, c, d := peer.ID("a"), peer.ID("b"), peer.ID("c"), peer.ID("d")
	for _, tc := range []struct {
		name  string
		do    func(g *Table)
		peer  peer.ID
		want  psp.Known // vouched
		known int64     // -1: not known at all
	}{
		{"answered", func(g *Table) { g.Vouch(a, 4, now) }, a, psp.Known{Step: 4, Seen: true}, 4},
		{"claimed later, higher", func(g *Table) { g.Vouch(a, 4, now); g.Saw(a, 9) }, a, psp.Known{Step: 4, Seen: true}, 9},
		{"only claimed", func(g *Table) { g.Saw(b, 7) }, b, psp.Known{}, 7},
		{"an older answer lowers nothing", func(g *Table) { g.Vouch(a, 4, now); g.Vouch(a, 2, now) }, a, psp.Known{Step: 4, Seen: true}, 4},
		{"never heard of", func(*Table) {}, c, psp.Known{}, -1},
		{"distrusted: its answers are not vouched for", func(g *Table) {
			g.Vouch(d, 5, now)
			g.Distrust(d, now.Add(time.Minute))
			g.Vouch(d, 8, now.Add(30*time.Second))
		}, d, psp.Known{}, 8},
		{"distrust ends", func(g *Table) {
			g.Distrust(d, now.Add(time.Minute))
			g.Vouch(d, 8, now.Add(time.Minute))
		}, d, psp.Known{Step: 8, Seen: true}, 8},
		{"a failure does not end a distrust", func(g *Table) {
			g.Distrust(d, now.Add(time.Minute))
			g.Forget(d)
			g.Vouch(d, 8, now.Add(time.Second))
		}, d, psp.Known{}, 8},
		{"forgotten", func(g *Table) { g.Vouch(a, 4, now); g.Forget(a) }, a, psp.Known{}, -1},
		{"forgotten while distrusted", func(g *Table) { g.Vouch(d, 4, now); g.Distrust(d, now.Add(time.Minute)); g.Forget(d) }, d, psp.Known{}, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := New()
			tc.do(g)
			got := g.VouchedAll([]peer.ID{tc.peer}, now)[0]
			tc.want.Peer = string(tc.peer)
			if got != tc.want {
				t.Errorf("vouched %+v, want %+v", got, tc.want)
			}
			s, ok := g.Known(tc.peer)
			if ok != (tc.known >= 0) || ok && s != tc.known {
				t.Errorf("known %d, %v; want %d", s, ok, tc.known)
			}
		})
	}
}

// A promise of a progress notice holds a peer below the promised step
// until any sign of it reaching that step, its end, a distrust or a
// failure; an answer at or above the step promises nothing.
func TestProgressPromise(t *testing.T) {
	now := time.Now()
	by := now.Add(time.Second)
	a := peer.ID("a")
	for _, tc := range []struct {
		name  string
		do    func(g *Table)
		at    time.Time // when the check reads it
		below int64     // 0: no promise held
	}{
		{"promised", func(g *Table) { g.Vouch(a, 3, now); g.Promise(a, 5, now, by) }, now, 5},
		{"a notice at the step keeps it", func(g *Table) { g.Vouch(a, 3, now); g.Promise(a, 5, now, by); g.Saw(a, 5) }, now, 0},
		{"a claim still below leaves it", func(g *Table) { g.Vouch(a, 3, now); g.Promise(a, 5, now, by); g.Saw(a, 4) }, now, 5},
		{"an answer at the step ends it", func(g *Table) { g.Vouch(a, 3, now); g.Promise(a, 5, now, by); g.Vouch(a, 6, now) }, now, 0},
		{"it ends at its time", func(g *Table) { g.Vouch(a, 3, now); g.Promise(a, 5, now, by) }, by, 0},
		{"an older answer's lower promise", func(g *Table) {
			g.Vouch(a, 3, now)
			g.Promise(a, 6, now, by)
			g.Promise(a, 5, now, now.Add(time.Millisecond))
		}, now.Add(time.Millisecond), 6},
		{"none at a step already reached", func(g *Table) { g.Vouch(a, 5, now); g.Promise(a, 5, now, by) }, now, 0},
		{"none from a peer never answering", func(g *Table) { g.Promise(a, 5, now, by) }, now, 0},
		{"none while distrusted", func(g *Table) {
			g.Vouch(a, 3, now)
			g.Distrust(a, now.Add(time.Minute))
			g.Promise(a, 5, now, by)
		}, now, 0},
		{"a distrust ends it", func(g *Table) { g.Vouch(a, 3, now); g.Promise(a, 5, now, by); g.Distrust(a, by) }, now, 0},
		{"a failure ends it", func(g *Table) { g.Vouch(a, 3, now); g.Promise(a, 5, now, by); g.Forget(a) }, now, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := New()
			tc.do(g)
			if got := g.VouchedAll([]peer.ID{a}, tc.at)[0].Below; got != tc.below {
				t.Errorf("below %d, want %d", got, tc.below)
			}
		})
	}
}

func TestProgressRelease(t *testing.T) {
	g := New()
	now := time.Now()
	g.Wait("w3", 3, now)
	g.Wait("w5", 5, now)
	g.Wait("old", 1, now.Add(-2*WaiterTTL))
	g.Wait("w3", 2, now) // a lower threshold does not release it early

	for _, tc := range []struct {
		step int64
		want []peer.ID
	}{
		{2, nil}, // nobody released; "old" expires
		{3, []peer.ID{"w3"}},
		{4, nil}, // w3 was released once only
		{9, []peer.ID{"w5"}},
	} {
		got := g.Release(tc.step, now)
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
	g := New()
	now := time.Now()
	for i := range 2 * maxWaiters {
		g.Wait(peer.ID(fmt.Sprint(i)), 1, now)
	}
	if len(g.waiters) != maxWaiters {
		t.Fatalf("%d waiters held, want the cap %d", len(g.waiters), maxWaiters)
	}
	if got := g.Release(1, now); len(got) != maxWaiters {
		t.Fatalf("released %d of %d waiters, want all", len(got), maxWaiters)
	}
}
