package node

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/pspnode/pspnode/internal/vclock"
	"github.com/pspnode/pspnode/internal/wire"
	"github.com/pspnode/pspnode/node/barrier"
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
		want    barrier.Timing
	}{
		{"paper steps, 200 nodes: PollShare", true, 2, 0, 200,
			barrier.Timing{Recheck: ms(31.25), First: ms(7.8125), Wake: ms(15.625), Hedge: ms(7.8125), Timeout: time.Second}},
		{"a fifth of the step: a fifth of every interval", true, 0.4, 0, 200,
			barrier.Timing{Recheck: ms(6.25), First: ms(1.5625), Wake: ms(3.125), Hedge: ms(1.5625), Timeout: time.Second}},
		{"20 nodes: once per completion, c/N", true, 2, 0, 20,
			barrier.Timing{Recheck: ms(100), First: ms(25), Wake: ms(50), Hedge: ms(25), Timeout: time.Second}},
		{"population unknown: as one node", true, 2, 0, 0,
			barrier.Timing{Recheck: ms(500), First: ms(125), Wake: ms(250), Hedge: ms(125), Timeout: time.Second}},
		{"global barrier", false, 2, 0, 200,
			barrier.Timing{Recheck: ms(500), First: ms(125), Wake: ms(250), Hedge: ms(125), Timeout: time.Second}},
		{"round trips known: timeout from c and r", true, 0.4, 0.002, 200,
			barrier.Timing{Recheck: ms(6.25), First: ms(1.5625), Wake: ms(3.125), Hedge: ms(8), Timeout: ms(1000)}},
		{"fast steps, slow links: the round trip sets the floor", true, 0.02, 0.01, 200,
			barrier.Timing{Recheck: ms(20), First: ms(5), Wake: ms(10), Hedge: ms(40), Timeout: ms(160)}},
		{"fast steps, loopback: QueryTimeoutMin", true, 0.005, 0.0001, 200,
			barrier.Timing{Recheck: ms(0.2), First: ms(0.1), Wake: ms(0.1), Hedge: ms(0.4), Timeout: ms(50)}},
		{"compute near zero: PollMin", true, 1e-9, 0, 200,
			barrier.Timing{Recheck: ms(0.1), First: ms(0.1), Wake: ms(0.05), Hedge: ms(0.1), Timeout: time.Second}},
		{"very slow steps: PollMax", true, 60, 0, 200,
			barrier.Timing{Recheck: ms(500), First: ms(125), Wake: ms(250), Hedge: ms(125), Timeout: time.Second}},
	}
	for _, tc := range tests {
		if got := barrier.TimingOf(checkConfig(cfg), tc.sampled, tc.c, tc.r, tc.n); got != tc.want {
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
	want := barrier.Timing{Recheck: ms(0.05), First: ms(0.05), Wake: ms(0.025), Hedge: ms(0.4), Timeout: ms(20)}
	if got := barrier.TimingOf(checkConfig(crossed), true, 0.005, 0.0001, 200); got != want {
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
		a.bar.Progress().Vouch(b.ID(), r.Step, time.Now())
		a.bar.Promised(b.ID(), r, 6)
		below := func() int64 { return a.bar.Progress().VouchedAll([]peer.ID{b.ID()}, time.Now())[0].Below }
		if got := below(); got != 5 {
			t.Fatalf("promise below %d, want 5 (step 6 less staleness 1)", got)
		}
		// b advances short of the threshold: no notice, the promise holds.
		b.step.Store(4)
		b.bar.PushProgress(ctx, 4)
		if got := below(); got != 5 {
			t.Fatalf("after b reached 4: below %d, want 5", got)
		}
		// b reaches it: its notice ends the promise.
		b.step.Store(5)
		b.bar.PushProgress(ctx, 5)
		if !waitFor(5*time.Second, func() bool { return below() == 0 }) {
			t.Fatalf("the notice did not end the promise: below %d", below())
		}
		// An answer at or above the threshold promises nothing.
		r, err = a.queryStep(ctx, b.ID(), wire.StepRequest{Step: 6})
		if err != nil {
			t.Fatal(err)
		}
		a.bar.Progress().Vouch(b.ID(), r.Step, time.Now())
		a.bar.Promised(b.ID(), r, 6)
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
