package node

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/pspnode/pspnode/internal/vclock"
	"github.com/pspnode/pspnode/internal/wire"
	"github.com/pspnode/pspnode/node/status"
)

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
	crossed.Check.PollMax, crossed.Check.QueryTimeout = ms(0.05), ms(20)
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
		a.bar.progress.Vouch(b.ID(), r.Step, time.Now())
		a.bar.promised(b.ID(), r, 6)
		below := func() int64 { return a.bar.progress.VouchedAll([]peer.ID{b.ID()}, time.Now())[0].Below }
		if got := below(); got != 5 {
			t.Fatalf("promise below %d, want 5 (step 6 less staleness 1)", got)
		}
		// b advances short of the threshold: no notice, the promise holds.
		b.step.Store(4)
		b.bar.pushProgress(ctx, 4)
		if got := below(); got != 5 {
			t.Fatalf("after b reached 4: below %d, want 5", got)
		}
		// b reaches it: its notice ends the promise.
		b.step.Store(5)
		b.bar.pushProgress(ctx, 5)
		if !waitFor(5*time.Second, func() bool { return below() == 0 }) {
			t.Fatalf("the notice did not end the promise: below %d", below())
		}
		// An answer at or above the threshold promises nothing.
		r, err = a.queryStep(ctx, b.ID(), wire.StepRequest{Step: 6})
		if err != nil {
			t.Fatal(err)
		}
		a.bar.progress.Vouch(b.ID(), r.Step, time.Now())
		a.bar.promised(b.ID(), r, 6)
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
					behind += status.CounterValue(nd.m.KnownBehind)
					cached += status.CounterValue(nd.m.Cached)
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
