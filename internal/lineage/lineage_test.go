package lineage

import (
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/prometheus/client_golang/prometheus"
)

func TestLineageJudge(t *testing.T) {
	l := New(prometheus.NewRegistry(), Genesis{})
	now := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	older, own, younger := NewGenesis(now.Add(-time.Hour)), NewGenesis(now), NewGenesis(now.Add(time.Hour))
	p, q, r := peer.ID("p"), peer.ID("q"), peer.ID("r")
	if l.Judge(p, older, now) != Kin || l.Due(now) {
		t.Fatal("a node without a genesis judges lineages")
	}
	l.Set(own)
	for _, g := range []Genesis{{}, own} {
		if l.Judge(p, g, now) != Kin || l.Due(now) {
			t.Errorf("genesis %q is not Kin of %q, or makes the node look for the job's lineage", g, own)
		}
	}
	// Another lineage, older or younger: it does not count, its updates
	// are dropped for forkHold, and the node looks whether it is the job's.
	for _, g := range []Genesis{younger, older} {
		if l.Judge(q, g, now) != OtherFork || !l.FromOther(q, now) || l.FromOther(q, now.Add(forkHold)) {
			t.Errorf("a peer on %s: another fork whose updates are dropped for forkHold", g)
		}
		if !l.Due(now) || l.Due(now.Add(forkHold)) {
			t.Errorf("a peer on %s: the node looks within forkHold of hearing it, not after", g)
		}
	}
	// Looks that find the node on the job's lineage come less and less
	// often, up to forkHold; one that moved it comes again soon.
	l.Looked(now, true)
	if l.Due(now) || !l.Due(now.Add(convergeRetry)) {
		t.Error("the next look is not convergeRetry later")
	}
	l.Looked(now, true)
	if l.Due(now.Add(convergeRetry)) || !l.Due(now.Add(2*convergeRetry)) {
		t.Error("the second look that stayed did not double the wait")
	}
	l.Looked(now, false)
	if !l.Due(now.Add(convergeRetry)) {
		t.Error("after a move the wait is convergeRetry again")
	}
	if l.Judge(q, own, now) != Kin || l.FromOther(q, now) {
		t.Error("a peer back on this node's lineage is Kin again")
	}
	l.Judge(r, older, now)
	l.Set(older)
	if l.FromOther(r, now) || l.Judge(r, older, now) != Kin {
		t.Error("after taking a peer's genesis the peer is Kin")
	}
	l.Judge(p, own, now)
	l.Forget(p)
	if l.FromOther(p, now) {
		t.Error("a forgotten peer is still held on another lineage")
	}
}

func TestPickLineage(t *testing.T) {
	now := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	a, b, c := NewGenesis(now.Add(-time.Hour)), NewGenesis(now), NewGenesis(now.Add(time.Hour))
	cases := []struct {
		name   string
		counts map[Genesis]int
		want   Genesis
	}{
		{"none", map[Genesis]int{}, Genesis{}},
		{"only peers without a genesis", map[Genesis]int{{}: 3}, Genesis{}},
		{"the most peers", map[Genesis]int{a: 1, b: 3, c: 2}, b},
		{"a tie goes to the older", map[Genesis]int{c: 2, b: 2, a: 1}, b},
		{"1970 alone against three", map[Genesis]int{NewGenesis(time.Unix(0, 0)): 1, c: 3}, c},
		{"two alone: the older", map[Genesis]int{c: 1, a: 1}, a},
		{"peers without a genesis do not vote", map[Genesis]int{{}: 9, c: 1}, c},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := Pick(tc.counts); got != tc.want {
				t.Errorf("picked %s, want %s", got, tc.want)
			}
		})
	}
}

// exampleGenesis is the genesis of docs/protocols.md's examples:
// 2025-01-01T00:00:00Z, then the bytes 01 to 08.
var exampleGenesis = Genesis{0x18, 0x16, 0x68, 0x7e, 0xc0, 0x57, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8}

func TestGenesisOrder(t *testing.T) {
	if got := exampleGenesis.Time().UTC(); !got.Equal(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)) {
		t.Errorf("example genesis time %v", got)
	}
	a := NewGenesis(time.Unix(100, 0))
	b := NewGenesis(time.Unix(200, 0))
	if !a.Older(b) || b.Older(a) || a.Older(a) {
		t.Errorf("a genesis of t=100 s is not older than one of t=200 s: %s %s", a, b)
	}
	if !a.Older(Genesis{}) || (Genesis{}).Older(a) || (Genesis{}).Older(Genesis{}) {
		t.Error("every genesis is older than none, and none is older than anything")
	}
	c := NewGenesis(time.Unix(100, 0))
	if a == c || a.Older(c) == c.Older(a) {
		t.Errorf("two geneses of one instant are not totally ordered: %s %s", a, c)
	}
	if (Genesis{}).String() != "" || len(a.String()) != 32 {
		t.Errorf("String: %q %q", Genesis{}.String(), a.String())
	}
}

func TestClockOff(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		made time.Time
		off  bool
	}{
		{now.Add(-time.Hour), false},
		{now, false},
		{now.Add(30 * time.Second), false},
		{now.Add(5 * time.Minute), true},
	} {
		if _, off := ClockOff(NewGenesis(tc.made), now); off != tc.off {
			t.Errorf("a genesis made at %v, seen at %v: off %v, want %v", tc.made, now, off, tc.off)
		}
	}
	if _, off := ClockOff(Genesis{}, now); off {
		t.Error("no genesis is off")
	}
}
