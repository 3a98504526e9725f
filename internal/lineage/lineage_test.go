package lineage

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pspnode/pspnode/internal/vclock"
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

// first is a pick that always draws the first of n; last the last.
func first(int) int  { return 0 }
func last(n int) int { return n - 1 }

func TestDecide(t *testing.T) {
	now := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	own, x, y := NewGenesis(now), NewGenesis(now.Add(-time.Hour)), NewGenesis(now.Add(time.Hour))
	min := time.Minute
	cases := []struct {
		name    string
		own     Genesis
		young   bool
		tallies []Tally
		pick    func(int) int
		want    Genesis
	}{
		{"nothing else heard", own, false, []Tally{{own, 3, min}}, first, own},
		{"peers without a genesis do not vote", own, true, []Tally{{own, 1, 0}, {Genesis{}, 9, 0}}, first, own},
		// An established node (it has trained beside a peer of its
		// lineage for YoungFor) and peers it has just met.
		{"established: 1 on its lineage, 15 just met", own, false, []Tally{{own, 2, min}, {x, 15, 0}}, first, own},
		{"established: alone in the sample, 15 just met", own, false, []Tally{{own, 1, min}, {x, 15, time.Second}}, first, own},
		{"established: k = h, heard almost as long", own, false, []Tally{{own, 3, min}, {x, 3, min - TieWithin}}, first, own},
		{"established: more, heard almost as long", own, false, []Tally{{own, 3, min}, {x, 4, min - TieWithin}}, first, x},
		{"established: fewer, heard as long", own, false, []Tally{{own, 3, HistoryCap}, {x, 2, HistoryCap}}, first, own},
		{"established: as many, heard as long: stays", own, false, []Tally{{own, 3, HistoryCap}, {x, 3, HistoryCap}}, last, own},
		{"established: a lineage heard for longer", own, false, []Tally{{own, 3, min}, {x, 1, 2 * min}}, first, x},
		{"established: the longest heard of two older", own, false, []Tally{{own, 3, min}, {x, 1, 2 * min}, {y, 9, 3 * min}}, first, y},
		// A young node: restarted alone, or one of a simultaneous launch.
		{"young alone against three", own, true, []Tally{{own, 1, HistoryCap}, {x, 3, 0}}, first, x},
		{"young: two against one", own, true, []Tally{{own, 2, 0}, {x, 1, time.Second}}, first, own},
		{"young: one against one, the coin says move", own, true, []Tally{{own, 1, 0}, {x, 1, 0}}, first, x},
		{"young: one against one, the coin says stay", own, true, []Tally{{own, 1, 0}, {x, 1, 0}}, last, own},
		{"young: the other with more peers", own, true, []Tally{{own, 1, 0}, {x, 2, 0}, {y, 3, 0}}, first, y},
		// No age of a genesis counts: x is older than y by its maker's
		// clock, and only the draw chooses between them.
		{"joining: the most peers", Genesis{}, true, []Tally{{x, 1, 0}, {y, 3, 0}}, first, y},
		{"joining: a tie, the longest heard", Genesis{}, true, []Tally{{x, 2, 0}, {y, 2, time.Second}}, first, y},
		{"joining: a tie, the draw (first)", Genesis{}, true, []Tally{{y, 2, 0}, {x, 2, 0}}, first, y},
		{"joining: a tie, the draw (last)", Genesis{}, true, []Tally{{y, 2, 0}, {x, 2, 0}}, last, x},
		{"joining: none", Genesis{}, true, nil, first, Genesis{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := Decide(tc.own, tc.young, tc.tallies, tc.pick); got != tc.want {
				t.Errorf("decided %s, want %s", got, tc.want)
			}
		})
	}
}

// Choose tallies what the node has heard: its own history, and how long
// it has heard each other lineage's peers on it. A node that trained
// beside a peer for a minute is not moved by sixteen identities it heard
// for a second, nor by one it knew on its own lineage for long that
// switched; a lone node goes where most are.
func TestChooseByHistory(t *testing.T) {
	vclock.Test(t, func(t *testing.T) {
		own, x := NewGenesis(time.Now()), NewGenesis(time.Unix(0, 0))
		l := New(prometheus.NewRegistry(), own)
		l.pick = first
		kin, turncoat := peer.ID("kin"), peer.ID("turncoat")
		l.Judge(kin, own, time.Now())
		l.Judge(turncoat, own, time.Now())
		time.Sleep(time.Minute)
		peers, gs := []peer.ID{kin}, []Genesis{own}
		l.Judge(turncoat, x, time.Now())
		peers, gs = append(peers, turncoat), append(gs, x)
		for i := range 15 {
			p := peer.ID(fmt.Sprint("sybil", i))
			l.Judge(p, x, time.Now())
			peers, gs = append(peers, p), append(gs, x)
		}
		time.Sleep(time.Second)
		if got := l.Choose(peers, gs, time.Now()); got != own {
			t.Errorf("16 identities heard on another lineage for a second moved an established node to %s", got)
		}
		// Heard on it for about as long as the node has been on its own,
		// which takes HistoryCap (the node's history grows as theirs
		// does), a majority of the sample moves it; until then, not.
		for start := time.Now(); time.Since(start) < HistoryCap; {
			if got := l.Choose(peers, gs, time.Now()); got != own {
				t.Fatalf("%v after they came, 16 identities on another lineage moved an established node", time.Since(start))
			}
			time.Sleep(10 * time.Second)
			for i, p := range peers {
				l.Judge(p, gs[i], time.Now())
			}
		}
		if got := l.Choose(peers, gs, time.Now()); got != x {
			t.Errorf("16 peers heard on another lineage for HistoryCap: stayed on %s", got)
		}
		// Silence restarts a history: a peer heard once, long ago, is new.
		l.Set(x)
		l.Judge(kin, x, time.Now())
		y := NewGenesis(time.Now())
		l.Judge(turncoat, y, time.Now())
		time.Sleep(time.Hour)
		l.Judge(turncoat, y, time.Now())
		if got := l.Choose([]peer.ID{turncoat}, []Genesis{y}, time.Now()); got != x {
			t.Errorf("a peer heard once an hour ago and once now moved the node to %s", got)
		}

		// A node restarted alone (no peer of its lineage ever heard) goes
		// where most of the sample is.
		lone := New(prometheus.NewRegistry(), NewGenesis(time.Now()))
		time.Sleep(time.Hour)
		job := NewGenesis(time.Now())
		var jp []peer.ID
		for i := range 3 {
			p := peer.ID(fmt.Sprint("job", i))
			lone.Judge(p, job, time.Now())
			jp = append(jp, p)
		}
		if got := lone.Choose(jp, []Genesis{job, job, job}, time.Now()); got != job {
			t.Errorf("a lone node on its own lineage for an hour stayed (%s) beside three peers of the job", got)
		}
	})
}

// Two nodes that start a job at the same moment, each on a lineage of its
// own, settle on one within a few looks: each moves with probability one
// half while they disagree.
func TestLoneNodesSettle(t *testing.T) {
	vclock.Test(t, func(t *testing.T) {
		a, b := New(prometheus.NewRegistry(), NewGenesis(time.Now())), New(prometheus.NewRegistry(), NewGenesis(time.Now()))
		pa, pb := peer.ID("a"), peer.ID("b")
		rng := rand.New(rand.NewPCG(1, 2))
		a.pick, b.pick = rng.IntN, rng.IntN
		looks := 0
		for ; a.Own() != b.Own(); looks++ {
			if looks == 20 {
				t.Fatalf("two lone nodes still on two lineages after %d looks", looks)
			}
			ga, gb := a.Own(), b.Own()
			a.Judge(pb, gb, time.Now())
			b.Judge(pa, ga, time.Now())
			na := a.Choose([]peer.ID{pb}, []Genesis{gb}, time.Now())
			nb := b.Choose([]peer.ID{pa}, []Genesis{ga}, time.Now())
			a.Set(na)
			b.Set(nb)
			time.Sleep(time.Second)
		}
		t.Logf("settled after %d looks", looks)
	})
}

// exampleGenesis is the genesis of docs/protocols.md's examples:
// 2025-01-01T00:00:00Z, then the bytes 01 to 08.
var exampleGenesis = Genesis{0x18, 0x16, 0x68, 0x7e, 0xc0, 0x57, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8}

func TestGenesis(t *testing.T) {
	if got := exampleGenesis.Time().UTC(); !got.Equal(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)) {
		t.Errorf("example genesis time %v", got)
	}
	a, c := NewGenesis(time.Unix(100, 0)), NewGenesis(time.Unix(100, 0))
	if a == c || a.IsZero() {
		t.Errorf("two geneses of one instant are the same, or none: %s %s", a, c)
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
