package node

import (
	"context"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/pspnode/pspnode/internal/vclock"
	"github.com/pspnode/pspnode/internal/wire"
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

// A sampled check counts a peer without asking only on steps the peer gave
// in answer to this node's queries (vouch), and not while the screen holds
// its reports refused (distrust); a step a peer merely claimed (saw)
// serves the global barriers alone.
func TestProgressVouched(t *testing.T) {
	now := time.Now()
	a, b, c, d := peer.ID("a"), peer.ID("b"), peer.ID("c"), peer.ID("d")
	for _, tc := range []struct {
		name  string
		do    func(g *progress)
		peer  peer.ID
		want  psp.Known // vouched
		known int64     // -1: not known at all
	}{
		{"answered", func(g *progress) { g.vouch(a, 4, now) }, a, psp.Known{Step: 4, Seen: true}, 4},
		{"claimed later, higher", func(g *progress) { g.vouch(a, 4, now); g.saw(a, 9) }, a, psp.Known{Step: 4, Seen: true}, 9},
		{"only claimed", func(g *progress) { g.saw(b, 7) }, b, psp.Known{}, 7},
		{"an older answer lowers nothing", func(g *progress) { g.vouch(a, 4, now); g.vouch(a, 2, now) }, a, psp.Known{Step: 4, Seen: true}, 4},
		{"never heard of", func(*progress) {}, c, psp.Known{}, -1},
		{"distrusted: its answers are not vouched for", func(g *progress) {
			g.vouch(d, 5, now)
			g.distrust(d, now.Add(time.Minute))
			g.vouch(d, 8, now.Add(30*time.Second))
		}, d, psp.Known{}, 8},
		{"distrust ends", func(g *progress) {
			g.distrust(d, now.Add(time.Minute))
			g.vouch(d, 8, now.Add(time.Minute))
		}, d, psp.Known{Step: 8, Seen: true}, 8},
		{"a failure does not end a distrust", func(g *progress) {
			g.distrust(d, now.Add(time.Minute))
			g.forget(d)
			g.vouch(d, 8, now.Add(time.Second))
		}, d, psp.Known{}, 8},
		{"forgotten", func(g *progress) { g.vouch(a, 4, now); g.forget(a) }, a, psp.Known{}, -1},
		{"forgotten while distrusted", func(g *progress) { g.vouch(d, 4, now); g.distrust(d, now.Add(time.Minute)); g.forget(d) }, d, psp.Known{}, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newProgress()
			tc.do(g)
			got := g.vouchedAll([]peer.ID{tc.peer}, now)[0]
			tc.want.Peer = string(tc.peer)
			if got != tc.want {
				t.Errorf("vouched %+v, want %+v", got, tc.want)
			}
			s, ok := g.known(tc.peer)
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
		do    func(g *progress)
		at    time.Time // when the check reads it
		below int64     // 0: no promise held
	}{
		{"promised", func(g *progress) { g.vouch(a, 3, now); g.promise(a, 5, now, by) }, now, 5},
		{"a notice at the step keeps it", func(g *progress) { g.vouch(a, 3, now); g.promise(a, 5, now, by); g.saw(a, 5) }, now, 0},
		{"a claim still below leaves it", func(g *progress) { g.vouch(a, 3, now); g.promise(a, 5, now, by); g.saw(a, 4) }, now, 5},
		{"an answer at the step ends it", func(g *progress) { g.vouch(a, 3, now); g.promise(a, 5, now, by); g.vouch(a, 6, now) }, now, 0},
		{"it ends at its time", func(g *progress) { g.vouch(a, 3, now); g.promise(a, 5, now, by) }, by, 0},
		{"an older answer's lower promise", func(g *progress) {
			g.vouch(a, 3, now)
			g.promise(a, 6, now, by)
			g.promise(a, 5, now, now.Add(time.Millisecond))
		}, now.Add(time.Millisecond), 6},
		{"none at a step already reached", func(g *progress) { g.vouch(a, 5, now); g.promise(a, 5, now, by) }, now, 0},
		{"none from a peer never answering", func(g *progress) { g.promise(a, 5, now, by) }, now, 0},
		{"none while distrusted", func(g *progress) {
			g.vouch(a, 3, now)
			g.distrust(a, now.Add(time.Minute))
			g.promise(a, 5, now, by)
		}, now, 0},
		{"a distrust ends it", func(g *progress) { g.vouch(a, 3, now); g.promise(a, 5, now, by); g.distrust(a, by) }, now, 0},
		{"a failure ends it", func(g *progress) { g.vouch(a, 3, now); g.promise(a, 5, now, by); g.forget(a) }, now, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newProgress()
			tc.do(g)
			if got := g.vouchedAll([]peer.ID{a}, tc.at)[0].Below; got != tc.below {
				t.Errorf("below %d, want %d", got, tc.below)
			}
		})
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

// TestBarrierTiming checks the timing rules (timing.go): intervals follow
// the compute time c and the round trip r, so they scale with the step;
// the floors and caps hold at the extremes.
func TestBarrierTiming(t *testing.T) {
	ms := func(f float64) time.Duration { return time.Duration(f * float64(time.Millisecond)) }
	cfg := DefaultConfig() // PollShare 1/64, GlobalPollShare 1/4, PollMin 0.1 ms, PollMax 500 ms, timeouts 50 ms..1 s
	tests := []struct {
		name    string
		sampled bool
		c, r, n float64 // seconds, seconds, nodes
		want    timing
	}{
		{"paper steps, 200 nodes: PollShare", true, 2, 0, 200,
			timing{recheck: ms(31.25), first: ms(7.8125), wake: ms(15.625), hedge: ms(7.8125), timeout: time.Second}},
		{"a fifth of the step: a fifth of every interval", true, 0.4, 0, 200,
			timing{recheck: ms(6.25), first: ms(1.5625), wake: ms(3.125), hedge: ms(1.5625), timeout: time.Second}},
		{"20 nodes: once per completion, c/N", true, 2, 0, 20,
			timing{recheck: ms(100), first: ms(25), wake: ms(50), hedge: ms(25), timeout: time.Second}},
		{"population unknown: as one node", true, 2, 0, 0,
			timing{recheck: ms(500), first: ms(125), wake: ms(250), hedge: ms(125), timeout: time.Second}},
		{"global barrier", false, 2, 0, 200,
			timing{recheck: ms(500), first: ms(125), wake: ms(250), hedge: ms(125), timeout: time.Second}},
		{"round trips known: timeout from c and r", true, 0.4, 0.002, 200,
			timing{recheck: ms(6.25), first: ms(1.5625), wake: ms(3.125), hedge: ms(8), timeout: ms(1000)}},
		{"fast steps, slow links: the round trip sets the floor", true, 0.02, 0.01, 200,
			timing{recheck: ms(20), first: ms(5), wake: ms(10), hedge: ms(40), timeout: ms(160)}},
		{"fast steps, loopback: QueryTimeoutMin", true, 0.005, 0.0001, 200,
			timing{recheck: ms(0.2), first: ms(0.1), wake: ms(0.1), hedge: ms(0.4), timeout: ms(50)}},
		{"compute near zero: PollMin", true, 1e-9, 0, 200,
			timing{recheck: ms(0.1), first: ms(0.1), wake: ms(0.05), hedge: ms(0.1), timeout: time.Second}},
		{"very slow steps: PollMax", true, 60, 0, 200,
			timing{recheck: ms(500), first: ms(125), wake: ms(250), hedge: ms(125), timeout: time.Second}},
	}
	for _, tc := range tests {
		if got := barrierTiming(cfg, tc.sampled, tc.c, tc.r, tc.n); got != tc.want {
			t.Errorf("%s (c %v s, r %v s, N %v): %+v, want %+v", tc.name, tc.c, tc.r, tc.n, got, tc.want)
		}
	}

	// Caps below their floors (--poll-max 50µs, --query-timeout 20ms): the
	// caps win, and no interval is longer than the re-check.
	crossed := cfg
	crossed.PollMax, crossed.QueryTimeout = ms(0.05), ms(20)
	if err := crossed.Validate(); err != nil {
		t.Errorf("crossed bounds refused: %v", err)
	}
	want := timing{recheck: ms(0.05), first: ms(0.05), wake: ms(0.025), hedge: ms(0.4), timeout: ms(20)}
	if got := barrierTiming(crossed, true, 0.005, 0.0001, 200); got != want {
		t.Errorf("crossed bounds: %+v, want %+v", got, want)
	}
}

// An answerer behind the asker's threshold promises it a notice (the
// 1.1.0 notices field) and keeps the promise: the asker holds it below
// until the answerer reaches the threshold and says so, then not.
func TestPromisedNoticeIsKept(t *testing.T) {
	vclock.Test(t, func(t *testing.T) {
		nodes := memNodes(t, 2, "pssp:2:1", 0.01)
		a, b := nodes[0], nodes[1]
		a.compute.Store(math.Float64bits(1)) // a mean step of 1 s: promises held up to 4 s
		a.step.Store(6)
		b.step.Store(3)
		ctx := t.Context()
		r, err := a.queryStep(ctx, b.ID(), wire.StepRequest{Step: 6})
		if err != nil {
			t.Fatal(err)
		}
		if r.Step != 3 || r.Ext == nil || !r.Ext.Notices || r.Ext.Staleness != 1 {
			t.Fatalf("reply %+v, ext %+v: want step 3 and notices with staleness 1", r, r.Ext)
		}
		a.progress.vouch(b.ID(), r.Step, time.Now())
		a.promised(b.ID(), r, 6)
		below := func() int64 { return a.progress.vouchedAll([]peer.ID{b.ID()}, time.Now())[0].Below }
		if got := below(); got != 5 {
			t.Fatalf("promise below %d, want 5 (step 6 less staleness 1)", got)
		}
		// b advances short of the threshold: no notice, the promise holds.
		b.step.Store(4)
		b.pushProgress(ctx, 4)
		if got := below(); got != 5 {
			t.Fatalf("after b reached 4: below %d, want 5", got)
		}
		// b reaches it: its notice ends the promise.
		b.step.Store(5)
		b.pushProgress(ctx, 5)
		if !waitFor(5*time.Second, func() bool { return below() == 0 }) {
			t.Fatalf("the notice did not end the promise: below %d", below())
		}
		// An answer at or above the threshold promises nothing.
		r, err = a.queryStep(ctx, b.ID(), wire.StepRequest{Step: 6})
		if err != nil {
			t.Fatal(err)
		}
		a.progress.vouch(b.ID(), r.Step, time.Now())
		a.promised(b.ID(), r, 6)
		if got := below(); got != 0 {
			t.Fatalf("b at 5 promised below %d", got)
		}
	})
}

// Waiting nodes count peers they have heard answer at or above the check's
// threshold without asking them again (pBSP), and fail checks on peers
// known below it without asking them (sampled and global barriers alike),
// and the barrier still holds: no node runs further ahead of the slowest
// than the barrier allows.
func TestChecksFailOnKnownBehind(t *testing.T) {
	for _, tc := range []struct {
		barrier string
		spread  int64 // the most steps between the fastest and the slowest
	}{
		{"pbsp:2", 4}, // β = 2 of 4 others: a node passes only with two peers at its step
		{"bsp", 1},
		{"ssp:2", 3},
	} {
		t.Run(tc.barrier, func(t *testing.T) {
			vclock.Test(t, func(t *testing.T) {
				nodes := memNodes(t, 5, tc.barrier, 0.01)
				ctx, cancel := context.WithCancel(t.Context())
				wait := runAll(t, ctx, nodes)
				defer func() { cancel(); wait() }()
				spread := int64(0)
				if !waitFor(20*time.Second, func() bool {
					hi := int64(0)
					for _, nd := range nodes {
						hi = max(hi, nd.Step())
					}
					spread = max(spread, hi-minStep(nodes))
					return minStep(nodes) >= 30
				}) {
					t.Fatalf("not every node reached step 30: lowest at %d", minStep(nodes))
				}
				behind, cached := 0.0, 0.0
				for _, nd := range nodes {
					behind += counterValue(nd.m.knownBehind)
					cached += counterValue(nd.m.cached)
				}
				if behind == 0 {
					t.Error("no check failed on a peer known behind")
				}
				if cached == 0 {
					t.Error("no peer was counted without asking")
				}
				if spread > tc.spread {
					t.Errorf("step spread reached %d under %s, want at most %d", spread, tc.barrier, tc.spread)
				}
			})
		})
	}
}
