package psp

import (
	"math"
	"slices"
	"testing"
)

// The test timing: compute 1 s, round trip 10 ms, population 10 give a
// sampled barrier p = 0.1 s, a first re-check after 25 ms, a wake gap of
// 50 ms, a hedge delay of 40 ms and a query timeout of 1 s.
var testTiming = TimingConfig{PollShare: 1.0 / 64, GlobalPollShare: 1.0 / 4, PollMin: 0.0001, PollMax: 0.5, QueryTimeoutMin: 0.05, QueryTimeout: 1}

// ev is one input to a Checker and what its output must show.
type ev struct {
	op    string // start, drawn, known, answer, refused, fail, tick, woken, recheck
	peers []string
	known []Known
	step  Step
	now   float64
	heard bool

	// expectations (checked when set)
	ask      []string
	draw     int
	wantKnow bool
	done     bool
	pass     bool
	iso      bool
	early    bool
	wake     float64 // -1: none
}

func (e ev) apply(c *Checker, self Step) CheckOut {
	switch e.op {
	case "start":
		c.Start(CheckStart{Self: self, Population: 10, Compute: 1, RTT: 0.01, Now: e.now})
	case "drawn":
		c.Drawn(e.peers, e.heard, e.now)
	case "known":
		c.Known(e.known, e.heard, e.now)
	case "drawnKnown":
		c.DrawnKnown(e.peers, e.known, e.heard, e.now)
	case "answer":
		c.Answer(e.peers[0], Observation{Peer: e.peers[0], Step: e.step}, true, e.now)
	case "refused":
		c.Answer(e.peers[0], Observation{}, false, e.now)
	case "fail":
		c.Failed(e.peers[0], e.now)
	case "tick":
		c.Tick(e.now)
	case "woken":
		c.Woken(e.now)
	case "recheck":
		c.Recheck(e.now)
	default:
		panic("unknown op " + e.op)
	}
	return c.Ready()
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func TestChecker(t *testing.T) {
	pbsp := Spec{Kind: PBSP, Beta: 3}
	pssp := Spec{Kind: PSSP, Beta: 2, Staleness: 1}
	pdssp := Spec{Kind: PDSSP, Beta: 2, Staleness: 1, Upper: 3}
	bsp := Spec{Kind: BSP}
	tests := []struct {
		name string
		spec Spec
		self Step
		evs  []ev
	}{
		{"asp passes at once", Spec{Kind: ASP}, 5, []ev{
			{op: "start", done: true, pass: true},
		}},
		{"pbsp: every answer at the step passes", pbsp, 5, []ev{
			{op: "start", draw: 3},
			{op: "drawn", peers: []string{"a", "b", "c"}, ask: []string{"a", "b", "c"}, wake: 0.04},
			{op: "answer", peers: []string{"a"}, step: 5, now: 0.01, wake: 0.04},
			{op: "answer", peers: []string{"b"}, step: 7, now: 0.01},
			{op: "answer", peers: []string{"c"}, step: 6, now: 0.02, done: true, pass: true},
		}},
		{"pbsp: the first answer behind ends the check early", pbsp, 5, []ev{
			{op: "start", draw: 3},
			{op: "drawn", peers: []string{"a", "b", "c"}, ask: []string{"a", "b", "c"}},
			{op: "answer", peers: []string{"b"}, step: 4, now: 0.01, done: true, early: true, wake: 0.01 + 0.025},
			{op: "answer", peers: []string{"a"}, step: 9, now: 0.02, wake: 0.035}, // late: ignored
			{op: "tick", now: 0.03, wake: 0.035},
			{op: "tick", now: 0.04, draw: 3},
		}},
		{"pssp: within staleness passes", pssp, 5, []ev{
			{op: "start", draw: 2},
			{op: "drawn", peers: []string{"a", "b"}},
			{op: "answer", peers: []string{"a"}, step: 4},
			{op: "answer", peers: []string{"b"}, step: 4, done: true, pass: true},
		}},
		{"pdssp weighs every answer: no early exit", pdssp, 5, []ev{
			{op: "start", draw: 2},
			{op: "drawn", peers: []string{"a", "b"}},
			{op: "answer", peers: []string{"a"}, step: 0},
			{op: "answer", peers: []string{"b"}, step: 5, done: true},
		}},
		{"a failed query is replaced by a fresh draw", pbsp, 5, []ev{
			{op: "start", draw: 3},
			{op: "drawn", peers: []string{"a", "b", "c"}},
			{op: "fail", peers: []string{"a"}, now: 0.01, draw: 6},
			{op: "drawn", peers: []string{"a", "b", "d", "e"}, now: 0.01, ask: []string{"d"}},
			{op: "answer", peers: []string{"b"}, step: 5, now: 0.02},
			{op: "answer", peers: []string{"c"}, step: 5, now: 0.02},
			{op: "answer", peers: []string{"d"}, step: 5, now: 0.02, done: true, pass: true},
		}},
		{"a refused answer is replaced from the spares", pbsp, 5, []ev{
			{op: "start", draw: 3},
			{op: "drawn", peers: []string{"a", "b", "c"}},
			{op: "fail", peers: []string{"a"}, draw: 6},
			{op: "drawn", peers: []string{"d", "e"}, ask: []string{"d"}},
			{op: "refused", peers: []string{"d"}, ask: []string{"e"}},
		}},
		{"a slow peer is hedged after the hedge delay", pbsp, 5, []ev{
			{op: "start", draw: 3},
			{op: "drawn", peers: []string{"a", "b", "c"}, wake: 0.04},
			{op: "answer", peers: []string{"a"}, step: 5, now: 0.01},
			{op: "answer", peers: []string{"b"}, step: 5, now: 0.01, wake: 0.04},
			{op: "tick", now: 0.04, draw: 6},
			{op: "drawn", peers: []string{"a", "x"}, now: 0.04, ask: []string{"x"}, wake: 0.08},
			{op: "answer", peers: []string{"x"}, step: 6, now: 0.05, done: true, pass: true},
		}},
		{"the replacement budget runs out", Spec{Kind: PBSP, Beta: 1}, 5, []ev{
			{op: "start", draw: 1},
			{op: "drawn", peers: []string{"a"}},
			{op: "fail", peers: []string{"a"}, draw: 2},
			{op: "drawn", peers: []string{"b", "c"}, ask: []string{"b"}},
			{op: "fail", peers: []string{"b"}, ask: []string{"c"}},
			{op: "fail", peers: []string{"c"}, done: true, iso: true},
		}},
		{"every query failed: isolated", Spec{Kind: PBSP, Beta: 1, Staleness: 0}, 5, []ev{
			{op: "start", draw: 1},
			{op: "drawn", peers: []string{"a"}},
			{op: "fail", peers: []string{"a"}, draw: 2},
			{op: "drawn", peers: []string{"a"}, done: true, iso: true, wake: 0.025},
		}},
		{"no peer, heard from one lately: isolated", pbsp, 5, []ev{
			{op: "start", draw: 3},
			{op: "drawn", heard: true, done: true, iso: true},
		}},
		{"no peer, none heard lately: alone, passes", pbsp, 5, []ev{
			{op: "start", draw: 3},
			{op: "drawn", done: true, pass: true},
		}},
		{"a refused answer is still a sign of life", Spec{Kind: PBSP, Beta: 1}, 5, []ev{
			{op: "start", draw: 1},
			{op: "drawn", peers: []string{"a"}},
			{op: "refused", peers: []string{"a"}, draw: 2},
			{op: "drawn", peers: []string{"a"}, done: true, pass: true},
		}},
		{"wait: first re-check, then doubling up to p", pbsp, 5, []ev{
			{op: "start", draw: 3},
			{op: "drawn", peers: []string{"a"}},
			{op: "answer", peers: []string{"a"}, step: 1, now: 1, done: true, early: true, wake: 1.025},
			{op: "tick", now: 1.02, wake: 1.025},
			{op: "tick", now: 1.03, draw: 3},
			{op: "drawn", peers: []string{"a"}, now: 1.03},
			{op: "answer", peers: []string{"a"}, step: 1, now: 1.03, done: true, early: true, wake: 1.08},
			{op: "tick", now: 1.09, draw: 3},
			{op: "drawn", peers: []string{"a"}, now: 1.09},
			{op: "answer", peers: []string{"a"}, step: 1, now: 1.1, done: true, early: true, wake: 1.2},
			{op: "tick", now: 1.21, draw: 3},
			{op: "drawn", peers: []string{"a"}, now: 1.21},
			{op: "answer", peers: []string{"a"}, step: 1, now: 1.21, done: true, early: true, wake: 1.31}, // capped at p
		}},
		{"a progress report brings the next check forward", pbsp, 5, []ev{
			{op: "start", draw: 3},
			{op: "drawn", peers: []string{"a"}},
			{op: "answer", peers: []string{"a"}, step: 1, now: 1, done: true, early: true, wake: 1.025},
			{op: "tick", now: 1.03, draw: 3},
			{op: "drawn", peers: []string{"a"}, now: 1.03},
			{op: "answer", peers: []string{"a"}, step: 1, now: 1.03, done: true, early: true, wake: 1.08},
			{op: "tick", now: 1.09, draw: 3},
			{op: "drawn", peers: []string{"a"}, now: 1.09},
			{op: "answer", peers: []string{"a"}, step: 1, now: 1.1, done: true, early: true, wake: 1.2},
			{op: "woken", now: 1.11, wake: 1.15}, // the wake gap after the last check: 50 ms
			{op: "woken", now: 1.16, draw: 3},
		}},
		{"a report during a check applies when it fails", pbsp, 5, []ev{
			{op: "start", draw: 3},
			{op: "drawn", peers: []string{"a"}},
			{op: "woken", now: 0.001, wake: 0.04},
			{op: "answer", peers: []string{"a"}, step: 1, now: 0.002, done: true, early: true, wake: 0.027},
		}},
		{"recheck starts the next check at once", pbsp, 5, []ev{
			{op: "start", draw: 3},
			{op: "drawn", peers: []string{"a"}},
			{op: "answer", peers: []string{"a"}, step: 1, done: true, early: true},
			{op: "recheck", now: 0.001, draw: 3},
		}},
		{"pbsp: drawn peers known at the step count without asking", pbsp, 5, []ev{
			{op: "start", draw: 3},
			{op: "drawnKnown", peers: []string{"a", "b", "c"}, known: []Known{{Step: 5, Seen: true}, {Step: 9, Seen: true}, {Step: 6, Seen: true}},
				done: true, pass: true},
		}},
		{"pbsp: the unknown and those known behind are asked", pbsp, 5, []ev{
			{op: "start", draw: 3},
			{op: "drawnKnown", peers: []string{"a", "b", "c"}, known: []Known{{Step: 5, Seen: true}, {}, {Step: 3, Seen: true}},
				ask: []string{"b", "c"}, wake: 0.04},
			{op: "answer", peers: []string{"b"}, step: 5, wake: 0.04},
			{op: "answer", peers: []string{"c"}, step: 6, done: true, pass: true},
		}},
		{"pssp: known at the threshold (step less staleness) counts", pssp, 5, []ev{
			{op: "start", draw: 2},
			{op: "drawnKnown", peers: []string{"a", "b"}, known: []Known{{Step: 4, Seen: true}, {Step: 3, Seen: true}}, ask: []string{"b"}},
			{op: "answer", peers: []string{"b"}, step: 3, done: true, early: true},
		}},
		{"pdssp: dynamic, so every drawn peer is asked", pdssp, 5, []ev{
			{op: "start", draw: 2},
			{op: "drawnKnown", peers: []string{"a", "b"}, known: []Known{{Step: 9, Seen: true}, {Step: 9, Seen: true}}, ask: []string{"a", "b"}},
		}},
		{"pbsp: a replacement is never a peer counted without asking", pbsp, 5, []ev{
			{op: "start", draw: 3},
			{op: "drawnKnown", peers: []string{"a", "b", "c"}, known: []Known{{Step: 5, Seen: true}, {}, {}}, ask: []string{"b", "c"}},
			{op: "fail", peers: []string{"b"}, draw: 6},
			{op: "drawn", peers: []string{"a", "b", "c", "d"}, ask: []string{"d"}},
			{op: "answer", peers: []string{"c"}, step: 5},
			{op: "answer", peers: []string{"d"}, step: 5, done: true, pass: true},
		}},
		{"pbsp: counted peers do not make up for queries that all failed", pbsp, 5, []ev{
			{op: "start", draw: 3},
			{op: "drawnKnown", peers: []string{"a", "b", "c"}, known: []Known{{Step: 5, Seen: true}, {Step: 5, Seen: true}, {}}, ask: []string{"c"}},
			{op: "fail", peers: []string{"c"}, draw: 6},
			{op: "drawn", peers: []string{"a", "b", "c"}, done: true, iso: true},
		}},
		{"pbsp: a drawn peer known below the threshold fails the check unasked", pbsp, 5, []ev{
			{op: "start", draw: 3},
			{op: "drawnKnown", peers: []string{"a", "b", "c"}, known: []Known{{}, {Step: 3, Seen: true, Below: 5}, {Step: 5, Seen: true}},
				ask: []string{}, done: true, early: true, wake: 0.025},
			{op: "tick", now: 0.025, draw: 3},
		}},
		{"pbsp: a promise for a step above the threshold says nothing now", pbsp, 5, []ev{
			{op: "start", draw: 3},
			{op: "drawnKnown", peers: []string{"a", "b", "c"}, known: []Known{{Step: 4, Seen: true, Below: 6}, {Step: 5, Seen: true}, {}},
				ask: []string{"a", "c"}},
			{op: "answer", peers: []string{"a"}, step: 5},
			{op: "answer", peers: []string{"c"}, step: 5, done: true, pass: true},
		}},
		{"pssp: known below the step less staleness fails it", pssp, 5, []ev{
			{op: "start", draw: 2},
			{op: "drawnKnown", peers: []string{"a", "b"}, known: []Known{{}, {Step: 2, Seen: true, Below: 4}}, ask: []string{}, done: true, early: true},
		}},
		{"pdssp: dynamic, so a peer known below is still asked", pdssp, 5, []ev{
			{op: "start", draw: 2},
			{op: "drawnKnown", peers: []string{"a", "b"}, known: []Known{{Step: 1, Seen: true, Below: 2}, {}}, ask: []string{"a", "b"}},
		}},
		{"pbsp: a replacement draw known below is asked all the same", pbsp, 5, []ev{
			{op: "start", draw: 3},
			{op: "drawnKnown", peers: []string{"a", "b", "c"}, known: []Known{{}, {}, {}}, ask: []string{"a", "b", "c"}},
			{op: "fail", peers: []string{"a"}, draw: 6},
			{op: "drawn", peers: []string{"a", "b", "c", "d"}, ask: []string{"d"}},
		}},
		{"bsp: peers seen at the step count without asking", bsp, 5, []ev{
			{op: "start", wantKnow: true},
			{op: "known", known: []Known{{Peer: "a", Step: 5, Seen: true}, {Peer: "b", Step: 9, Seen: true}}, done: true, pass: true},
		}},
		{"bsp: the unseen first, then the lowest, ending at the first behind", bsp, 5, []ev{
			{op: "start", wantKnow: true},
			{op: "known", known: []Known{{Peer: "a", Step: 3, Seen: true}, {Peer: "b", Step: 5, Seen: true}, {Peer: "c"}, {Peer: "d", Step: 2, Seen: true}},
				ask: []string{"c", "d", "a"}, wake: -1},
			{op: "answer", peers: []string{"c"}, step: 5},
			{op: "answer", peers: []string{"d"}, step: 4, done: true, early: true},
		}},
		{"bsp: a peer known below the step fails the check unasked", bsp, 5, []ev{
			{op: "start", wantKnow: true},
			{op: "known", known: []Known{{Peer: "a"}, {Peer: "b", Step: 3, Seen: true, Below: 5}, {Peer: "c", Step: 2, Seen: true}},
				ask: []string{}, done: true, early: true},
		}},
		{"ssp: a promise above the threshold says nothing now", Spec{Kind: SSP, Staleness: 2}, 5, []ev{
			{op: "start", wantKnow: true},
			{op: "known", known: []Known{{Peer: "a", Step: 2, Seen: true, Below: 4}}, ask: []string{"a"}},
			{op: "answer", peers: []string{"a"}, step: 3, done: true, pass: true},
		}},
		{"dssp: dynamic, so a peer known below is asked", Spec{Kind: DSSP, Staleness: 1, Upper: 3}, 5, []ev{
			{op: "start", wantKnow: true},
			{op: "known", known: []Known{{Peer: "a", Step: 1, Seen: true, Below: 2}}, ask: []string{"a"}},
		}},
		{"bsp: every lagging peer caught up", bsp, 5, []ev{
			{op: "start", wantKnow: true},
			{op: "known", known: []Known{{Peer: "a", Step: 3, Seen: true}}, ask: []string{"a"}},
			{op: "answer", peers: []string{"a"}, step: 6, done: true, pass: true},
		}},
		{"bsp: every query failed: isolated", bsp, 5, []ev{
			{op: "start", wantKnow: true},
			{op: "known", known: []Known{{Peer: "a"}}, ask: []string{"a"}},
			{op: "fail", peers: []string{"a"}, done: true, iso: true},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := NewChecker(CheckConfig{Spec: tc.spec, Replacements: 2, Timing: testTiming}, nil)
			for i, e := range tc.evs {
				out := e.apply(c, tc.self)
				if e.ask != nil && !slices.Equal(out.Ask, e.ask) {
					t.Errorf("event %d (%s): ask %v, want %v", i, e.op, out.Ask, e.ask)
				}
				if out.Draw != e.draw {
					t.Errorf("event %d (%s): draw %d, want %d", i, e.op, out.Draw, e.draw)
				}
				if out.Known != e.wantKnow {
					t.Errorf("event %d (%s): known %v, want %v", i, e.op, out.Known, e.wantKnow)
				}
				if out.Done != e.done || out.Pass != e.pass || out.Isolated != e.iso || out.Stats.EarlyFail != e.early {
					t.Errorf("event %d (%s): done %v pass %v isolated %v early %v, want %v %v %v %v",
						i, e.op, out.Done, out.Pass, out.Isolated, out.Stats.EarlyFail, e.done, e.pass, e.iso, e.early)
				}
				switch {
				case e.wake < 0 && out.Wake != 0:
					t.Errorf("event %d (%s): wake at %v, want none", i, e.op, out.Wake)
				case e.wake > 0 && !near(out.Wake, e.wake):
					t.Errorf("event %d (%s): wake at %v, want %v", i, e.op, out.Wake, e.wake)
				}
			}
		})
	}
}

func TestCheckerGlobalQueriesBounded(t *testing.T) {
	c := NewChecker(CheckConfig{Spec: Spec{Kind: BSP}, GlobalQueries: 2, Timing: testTiming}, nil)
	c.Start(CheckStart{Self: 5})
	c.Ready()
	c.Known([]Known{{Peer: "a"}, {Peer: "b"}, {Peer: "c"}}, false, 0)
	if out := c.Ready(); !slices.Equal(out.Ask, []string{"a", "b"}) {
		t.Fatalf("first queries %v, want [a b]", out.Ask)
	}
	c.Answer("a", Observation{Peer: "a", Step: 5}, true, 0)
	if out := c.Ready(); !slices.Equal(out.Ask, []string{"c"}) {
		t.Fatalf("after one answer, asks %v, want [c]", out.Ask)
	}
	c.Answer("b", Observation{Peer: "b", Step: 5}, true, 0)
	c.Answer("c", Observation{Peer: "c", Step: 5}, true, 0)
	if out := c.Ready(); !out.Pass || out.Stats.Asked != 3 || out.Stats.Answered != 3 || out.Stats.Observed != 3 {
		t.Fatalf("end: %+v", out)
	}
}

func TestIsolated(t *testing.T) {
	pbsp := Spec{Kind: PBSP, Beta: 4}
	tests := []struct {
		name                      string
		sp                        Spec
		asked, answered, observed int
		heard, want               bool
	}{
		{"asp never", Spec{Kind: ASP}, 3, 0, 0, true, false},
		{"beta 0 never", Spec{Kind: PBSP}, 0, 0, 0, true, false},
		{"an answer", pbsp, 3, 1, 0, true, false},
		{"asked, none answered", pbsp, 3, 0, 0, false, true},
		{"global counted peers without asking", Spec{Kind: BSP}, 0, 0, 2, true, false},
		{"nobody to ask, heard lately", pbsp, 0, 0, 0, true, true},
		{"nobody to ask, alone", pbsp, 0, 0, 0, false, false},
	}
	for _, tc := range tests {
		if got := Isolated(tc.sp, tc.asked, tc.answered, tc.observed, tc.heard); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestBarrierTiming(t *testing.T) {
	tests := []struct {
		name    string
		sampled bool
		c, r, n float64
		want    Timing
	}{
		{"sampled, 10 nodes: c/N", true, 1, 0.01, 10, Timing{Recheck: 0.1, First: 0.025, Wake: 0.05, Hedge: 0.04, Timeout: 1}},
		{"global: GlobalPollShare", false, 1, 0, 10, Timing{Recheck: 0.25, First: 0.0625, Wake: 0.125, Hedge: 0.0625, Timeout: 1}},
		{"fast steps, slow links", true, 0.02, 0.01, 200, Timing{Recheck: 0.02, First: 0.005, Wake: 0.01, Hedge: 0.04, Timeout: 0.16}},
		{"very slow steps: PollMax", true, 60, 0, 200, Timing{Recheck: 0.5, First: 0.125, Wake: 0.25, Hedge: 0.125, Timeout: 1}},
	}
	for _, tc := range tests {
		got := BarrierTiming(testTiming, tc.sampled, tc.c, tc.r, tc.n)
		if !near(got.Recheck, tc.want.Recheck) || !near(got.First, tc.want.First) || !near(got.Wake, tc.want.Wake) ||
			!near(got.Hedge, tc.want.Hedge) || !near(got.Timeout, tc.want.Timeout) {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

// A check that fails on a peer known below its threshold asks nobody, is
// not isolated, and observes that one peer at its last known step.
func TestCheckerKnownBehindStats(t *testing.T) {
	c := NewChecker(CheckConfig{Spec: Spec{Kind: PBSP, Beta: 2}, Replacements: 2, Timing: testTiming}, nil)
	c.Start(CheckStart{Self: 7, Population: 10, Compute: 1, RTT: 0.01})
	c.Ready()
	c.DrawnKnown([]string{"a", "b"}, []Known{{Step: 8, Seen: true}, {Step: 4, Seen: true, Below: 7}}, true, 0)
	out := c.Ready()
	st := out.Stats
	if !out.Done || out.Pass || out.Isolated || st.Asked != 0 || st.Observed != 1 || !st.KnownBehind || !st.EarlyFail {
		t.Fatalf("check: %+v", out)
	}
	if obs := c.Observations(); len(obs) != 1 || obs[0] != (Observation{Peer: "b", Step: 4}) {
		t.Fatalf("observations %+v, want b at 4", obs)
	}
	// The next check starts afresh: nothing known, all asked.
	c.Tick(out.Wake)
	if r := c.Ready(); r.Draw != 2 {
		t.Fatalf("next check: %+v", r)
	}
	c.DrawnKnown([]string{"a", "b"}, []Known{{}, {}}, true, out.Wake)
	if r := c.Ready(); len(r.Ask) != 2 || r.Done {
		t.Fatalf("next check asks %v (done %v)", r.Ask, r.Done)
	}
}

// An auto sample size follows the population given at Start: one peer
// drawn in a job of four, ten in a job of two hundred.
func TestCheckerAutoBeta(t *testing.T) {
	for _, tc := range []struct {
		population float64
		draw       int
	}{{4, 1}, {10, 3}, {200, 10}} {
		c := NewChecker(CheckConfig{Spec: MustParse("pssp:auto:4"), Replacements: 2, Timing: testTiming}, nil)
		c.Start(CheckStart{Self: 10, Population: tc.population})
		if rd := c.Ready(); rd.Draw != tc.draw {
			t.Errorf("population %v: draws %d, want %d", tc.population, rd.Draw, tc.draw)
		}
	}
}
