package psp

import (
	"errors"
	"math"
	"testing"
)

// seenAt is one observation of peer "p" for a Pace test.
type seenAt struct {
	step Step
	now  float64
}

// steady is a peer seen at steps from..to, one step every iv seconds
// from time t0.
func steady(from, to Step, iv, t0 float64) []seenAt {
	var out []seenAt
	for s := from; s <= to; s++ {
		out = append(out, seenAt{step: s, now: t0 + float64(s-from)*iv})
	}
	return out
}

func TestPaceJudge(t *testing.T) {
	cat := func(a ...[]seenAt) []seenAt {
		var out []seenAt
		for _, x := range a {
			out = append(out, x...)
		}
		return out
	}
	// The node computes a step in 0.1 s; Factor 2, Horizon 8: a peer
	// slower than 0.2 s per step is slow, one more than 0.8 s of its own
	// steps from the threshold is far behind.
	tests := []struct {
		name      string
		ref       float64 // the node's compute time
		seen      []seenAt
		step      Step // the peer's step judged (after seen)
		threshold Step
		now       float64
		want      Excuse
	}{
		{"not behind holds (the barrier's own test passes it)", 0.1, steady(0, 10, 0.4, 0), 10, 10, 4.0, Holds},
		{"unknown peer, just behind: waited for", 0.1, nil, 7, 10, 0, Holds},
		{"unknown peer, more than the horizon behind: far", 0.1, nil, 1, 10, 0, Far},
		{"a peer at the node's pace, 3 behind: holds", 0.1, steady(0, 20, 0.1, 0), 20, 23, 2.0, Holds},
		{"a peer at the node's pace, 7 behind: holds", 0.1, steady(0, 20, 0.1, 0), 20, 27, 2.0, Holds},
		{"a peer at the node's pace, 9 behind: far", 0.1, steady(0, 20, 0.1, 0), 20, 29, 2.0, Far},
		{"a peer 4x slower, 1 behind: slow", 0.1, steady(0, 10, 0.4, 0), 10, 11, 4.0, Slow},
		{"a peer 10x slower: slow", 0.1, steady(0, 10, 1, 0), 10, 11, 10.0, Slow},
		{"a peer 1.5x slower, 2 behind: holds", 0.1, steady(0, 10, 0.15, 0), 10, 12, 1.5, Holds},
		{"a peer 1.5x slower, 6 behind: far", 0.1, steady(0, 10, 0.15, 0), 10, 16, 1.5, Far},
		{"a peer's claims are not its pace: seen once, it is taken at the node's", 0.1, []seenAt{{step: 10, now: 1}}, 10, 11, 1.0, Holds},
		{"a peer that stopped turns slow within 2·Factor·c", 0.1, steady(0, 20, 0.1, 0), 20, 21, 2.0 + 0.41, Slow},
		{"a peer that stopped lately still holds", 0.1, steady(0, 20, 0.1, 0), 20, 21, 2.0 + 0.35, Holds},
		{"slow then fast, far behind: far", 0.1, cat(steady(0, 10, 0.4, 0), steady(11, 30, 0.1, 4.1)), 30, 80, 6.0, Far},
		{"slow then fast, just behind: holds once it is learnt fast", 0.1, cat(steady(0, 10, 0.4, 0), steady(11, 30, 0.1, 4.1)), 30, 33, 6.0, Holds},
		{"fast then slow: slow", 0.1, cat(steady(0, 20, 0.1, 0), steady(21, 23, 0.5, 2.5)), 23, 24, 3.5, Slow},
		{"the clock steps back: nothing learnt, the peer holds", 0.1, cat(steady(0, 20, 0.1, 100), steady(21, 22, 0.1, 50)), 22, 23, 50.1, Holds},
		{"the clock steps forward: one check excuses every peer", 0.1, steady(0, 20, 0.1, 0), 20, 21, 3600, Slow},
		{"after a forward step, three observations bring the pace back", 0.1, cat(steady(0, 20, 0.1, 0), steady(21, 23, 0.1, 3600)), 23, 24, 3600.2, Holds},
		{"a regressed peer is learnt afresh", 0.1, cat(steady(0, 10, 1, 0), []seenAt{{step: 2, now: 10.5}}), 2, 5, 10.5, Holds},
		{"no reference yet: nothing excused", 0, steady(0, 10, 1, 0), 10, 100, 10, Holds},
		{"NaN time is ignored", 0.1, cat(steady(0, 20, 0.1, 0), []seenAt{{step: 21, now: math.NaN()}}), 20, 21, 2.0, Holds},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := NewPace(DefaultPaceConfig())
			p.SetCompute(tt.ref, 0)
			for _, o := range tt.seen {
				p.Observe("p", o.step, o.now)
			}
			if len(tt.seen) > 0 {
				p.Observe("p", tt.step, tt.now)
			}
			if got := p.Judge("p", tt.step, tt.threshold, tt.now); got != tt.want {
				t.Errorf("Judge = %v, want %v (interval %.3g)", got, tt.want, p.Interval("p", tt.now))
			}
		})
	}
}

func TestPaceInterval(t *testing.T) {
	p := NewPace(DefaultPaceConfig())
	p.SetCompute(0.1, 0)
	if got := p.Interval("p", 0); got != 0 {
		t.Fatalf("unknown peer: %v, want 0", got)
	}
	for _, o := range steady(0, 30, 0.4, 0) {
		p.Observe("p", o.step, o.now)
	}
	if got := p.Interval("p", 12); math.Abs(got-0.4) > 1e-9 {
		t.Errorf("a steady peer: %v s per step, want 0.4", got)
	}
	if got := p.Interval("p", 15); math.Abs(got-1.5) > 1e-9 {
		t.Errorf("a peer 3 s at its step: %v s per step, want 1.5", got)
	}
}

func TestPaceOffAndConfig(t *testing.T) {
	off := NewPace(PaceConfig{})
	off.SetCompute(0.1, 0)
	off.Observe("p", 0, 0)
	off.Observe("p", 1, 10)
	if got := off.Judge("p", 1, 100, 10); got != Holds {
		t.Errorf("off: %v, want holds", got)
	}
	for _, tt := range []struct {
		cfg PaceConfig
		ok  bool
	}{
		{PaceConfig{}, true},
		{DefaultPaceConfig(), true},
		{PaceConfig{Factor: 1, Horizon: 8}, false},
		{PaceConfig{Factor: 2}, false},
		{PaceConfig{Factor: math.Inf(1), Horizon: 8}, false},
		{PaceConfig{Factor: 2, Horizon: math.NaN()}, false},
	} {
		err := tt.cfg.Validate()
		if (err == nil) != tt.ok || (err != nil && !errors.Is(err, ErrPace)) {
			t.Errorf("Validate(%+v) = %v, want ok=%v", tt.cfg, err, tt.ok)
		}
	}
}

func TestPaceForgetsTheOldest(t *testing.T) {
	p := NewPace(DefaultPaceConfig())
	for i := range maxTracked + 10 {
		p.Observe(string(rune(i+1)), 0, float64(i))
	}
	if p.Len() != maxTracked {
		t.Fatalf("%d records, want %d", p.Len(), maxTracked)
	}
	if _, ok := p.peers[string(rune(1))]; ok {
		t.Error("the least recently seen peer was kept")
	}
}

// paceCheck is one barrier check of a Checker with the pace rule, on
// peers with a known history.
type paceCheck struct {
	peers []string // the draw
	known []Known  // what the node knows of them without asking (nil: nothing)
	steps []Step   // their answers, in the order of peers (asked peers only)
	now   float64
}

func TestCheckerPace(t *testing.T) {
	pssp := Spec{Kind: PSSP, Beta: 2, Staleness: 2}
	// History: "slow" steps every 0.4 s, "fast" every 0.1 s, the node's
	// compute 0.1 s; by t = 4 "slow" is at step 10, "fast" at 40.
	history := func(p *Pace) {
		for _, o := range steady(0, 10, 0.4, 0) {
			p.Observe("slow", o.step, o.now)
		}
		for _, o := range steady(0, 40, 0.1, 0) {
			p.Observe("fast", o.step, o.now)
		}
	}
	tests := []struct {
		name              string
		spec              Spec
		pace              PaceConfig
		self              Step
		checks            []paceCheck
		pass              bool
		slow, far         int
		early, knownBehnd bool
	}{
		{"a slow peer behind does not fail the check", pssp, DefaultPaceConfig(), 40,
			[]paceCheck{{peers: []string{"slow", "fast"}, steps: []Step{10, 40}, now: 4}}, true, 1, 0, false, false},
		{"without the rule it fails it (the paper's pSSP)", pssp, PaceConfig{}, 40,
			[]paceCheck{{peers: []string{"slow", "fast"}, steps: []Step{10, 40}, now: 4}}, false, 0, 0, true, false},
		{"a peer at the node's pace just behind fails it", pssp, DefaultPaceConfig(), 43,
			[]paceCheck{{peers: []string{"slow", "fast"}, steps: []Step{10, 40}, now: 4}}, false, 1, 0, true, false},
		{"a peer at the node's pace far behind does not", pssp, DefaultPaceConfig(), 60,
			[]paceCheck{{peers: []string{"fast"}, steps: []Step{40}, now: 4}}, true, 0, 1, false, false},
		{"a slow peer known below the threshold is excused unasked", pssp, DefaultPaceConfig(), 40,
			[]paceCheck{{peers: []string{"slow", "fast"}, known: []Known{{Step: 10, Seen: true, Below: 30}, {}}, steps: []Step{40}, now: 4}}, true, 1, 0, false, false},
		{"a peer at pace known below the threshold fails it unasked", pssp, DefaultPaceConfig(), 43,
			[]paceCheck{{peers: []string{"fast", "slow"}, known: []Known{{Step: 40, Seen: true, Below: 41}, {}}, now: 4}}, false, 0, 0, true, true},
		{"a peer that stops is excused within 2·Factor·c", pssp, DefaultPaceConfig(), 43,
			[]paceCheck{
				{peers: []string{"fast"}, steps: []Step{40}, now: 4},
				{peers: []string{"fast"}, steps: []Step{40}, now: 4.3},
				{peers: []string{"fast"}, steps: []Step{40}, now: 4.45},
			}, true, 1, 0, false, false},
		{"pdssp keeps its own controller", Spec{Kind: PDSSP, Beta: 2, Staleness: 2, Upper: 2}, DefaultPaceConfig(), 40,
			[]paceCheck{{peers: []string{"slow", "fast"}, steps: []Step{10, 40}, now: 4}}, false, 0, 0, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := NewChecker(CheckConfig{Spec: tt.spec, Replacements: 2, Timing: testTiming, Pace: tt.pace}, nil)
			if p := c.Pace(); p != nil {
				history(p)
			} else if tt.pace.On() && !tt.spec.Dynamic() {
				t.Fatal("no Pace with the rule on")
			}
			var out CheckOut
			for i, ck := range tt.checks {
				if i == 0 {
					c.Start(CheckStart{Self: tt.self, Population: 3, Compute: 0.1, RTT: 0.001, Now: ck.now})
				} else {
					c.Recheck(ck.now)
				}
				if rd := c.Ready(); rd.Draw == 0 {
					t.Fatalf("check %d: no draw (%+v)", i, rd)
				}
				if ck.known != nil {
					c.DrawnKnown(ck.peers, ck.known, false, ck.now)
				} else {
					c.Drawn(ck.peers, false, ck.now)
				}
				out = c.Ready()
				for j, p := range out.Ask {
					if out.Done {
						break
					}
					c.Answer(p, Observation{Peer: p, Step: ck.steps[j]}, true, ck.now)
					if rd := c.Ready(); rd.Done {
						out = rd
					}
				}
				if !out.Done {
					t.Fatalf("check %d did not end: %+v", i, out)
				}
			}
			st := out.Stats
			if out.Pass != tt.pass || st.Slow != tt.slow || st.Far != tt.far || st.EarlyFail != tt.early || st.KnownBehind != tt.knownBehnd {
				t.Errorf("pass %v slow %d far %d early %v known behind %v; want %v %d %d %v %v",
					out.Pass, st.Slow, st.Far, st.EarlyFail, st.KnownBehind, tt.pass, tt.slow, tt.far, tt.early, tt.knownBehnd)
			}
		})
	}
}

func TestPaceReference(t *testing.T) {
	tests := []struct {
		name        string
		c, interval []float64 // successive SetCompute calls
		want        float64
	}{
		{"unknown", []float64{0}, []float64{0}, 0},
		{"compute alone", []float64{0.1}, []float64{0}, 0.1},
		{"an interval with short waits", []float64{0.1}, []float64{0.12}, 0.12},
		{"a node held back: at most RefCap·c", []float64{0.1}, []float64{0.4}, 0.1 * RefCap},
		{"an interval below compute counts as compute", []float64{0.1}, []float64{0.05}, 0.1},
		{"smoothed", []float64{0.1, 0.2}, []float64{0, 0}, 0.1 + refAlpha*0.1},
		{"an unknown compute later keeps the reference", []float64{0.1, 0, math.NaN(), math.Inf(1)}, []float64{0, 0, 0, 0}, 0.1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := NewPace(DefaultPaceConfig())
			for i := range tt.c {
				p.SetCompute(tt.c[i], tt.interval[i])
			}
			if got := p.Reference(); math.Abs(got-tt.want) > 1e-12 {
				t.Errorf("Reference = %v, want %v", got, tt.want)
			}
		})
	}
}

// One pSSP(10, 4) check of ten answering peers, with the pace rule and
// without: what the rule adds to a check's CPU.
func BenchmarkCheckPace(b *testing.B) {
	peers := make([]string, 10)
	for i := range peers {
		peers[i] = string(rune('a' + i))
	}
	for _, tc := range []struct {
		name string
		pace PaceConfig
	}{{"off", PaceConfig{}}, {"on", DefaultPaceConfig()}} {
		b.Run(tc.name, func(b *testing.B) {
			c := NewChecker(CheckConfig{Spec: Spec{Kind: PSSP, Beta: 10, Staleness: 4}, Replacements: 2, Timing: testTiming, Pace: tc.pace}, nil)
			now, ask := 0.0, make([]string, 0, 10)
			for i := 0; b.Loop(); i++ {
				now += 0.1
				c.Start(CheckStart{Self: Step(i + 10), Population: 100, Compute: 0.1, RTT: 0.001, Now: now})
				c.Ready()
				c.Drawn(peers, false, now)
				ask = append(ask[:0], c.Ready().Ask...) // Ready's slice is valid until the next call
				for _, p := range ask {
					c.Answer(p, Observation{Peer: p, Step: Step(i + 8)}, true, now)
				}
				if !c.Ready().Pass {
					b.Fatal("the check failed")
				}
			}
		})
	}
}

// TestCheckerExcusesKnownSlowUnasked: a drawn peer known behind without a
// promise is excused without a round trip only while the pace rule's
// record of it is fresh; otherwise it is asked, as before.
func TestCheckerExcusesKnownSlowUnasked(t *testing.T) {
	pssp := Spec{Kind: PSSP, Beta: 2, Staleness: 2}
	tests := []struct {
		name       string
		self       Step
		known      Known // "slow"'s (or "fast"'s, when peer is "fast")
		peer       string
		now        float64
		answer     Step // the peer's answer, if asked
		wantAsked  int
		wantPass   bool
		wantSlow   int
		wantFar    int
		wantCached int
	}{
		{"a slow peer seen behind lately is excused unasked", 40, Known{Step: 10, Seen: true}, "slow", 4.1, 10, 1, true, 1, 0, 1},
		{"seen long ago, it is asked (and its answer judged)", 40, Known{Step: 10, Seen: true}, "slow", 6, 10, 2, true, 1, 0, 0},
		{"a peer at the node's pace just behind is asked", 43, Known{Step: 40, Seen: true}, "fast", 4.05, 40, 2, false, 0, 0, 0},
		{"a peer known at or above the threshold counts as before", 40, Known{Step: 39, Seen: true}, "fast", 4.05, 0, 1, true, 0, 0, 1},
		{"a peer at pace far behind is excused unasked", 60, Known{Step: 40, Seen: true}, "fast", 4.05, 40, 1, true, 0, 1, 1},
		{"nothing known of it: asked", 40, Known{}, "slow", 4.1, 10, 2, true, 1, 0, 0},
		// At pace, 9 behind the threshold as known: judged a step on
		// (8 behind, not beyond the horizon), so asked; its answer at 41
		// (the pace it shows now a little quicker) holds the node.
		{"known 9 behind at pace: judged a step on, asked", 52, Known{Step: 41, Seen: true}, "fast", 4.05, 41, 2, false, 0, 0, 0},
		// Known below its record's step (40): judged from the record's.
		{"known below its record: judged at the record's step", 50, Known{Step: 35, Seen: true}, "fast", 4.05, 48, 2, true, 0, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := NewChecker(CheckConfig{Spec: pssp, Replacements: 2, Timing: testTiming, Pace: DefaultPaceConfig()}, nil)
			for _, o := range steady(0, 10, 0.4, 0) {
				c.Pace().Observe("slow", o.step, o.now)
			}
			for _, o := range steady(0, 40, 0.1, 0) {
				c.Pace().Observe("fast", o.step, o.now)
			}
			for _, o := range steady(0, 60, 0.1, -2) {
				c.Pace().Observe("other", o.step, o.now)
			}
			c.Start(CheckStart{Self: tt.self, Population: 3, Compute: 0.1, RTT: 0.001, Now: tt.now})
			if rd := c.Ready(); rd.Draw == 0 {
				t.Fatalf("no draw: %+v", rd)
			}
			// "other" is at the node's pace and ahead: it passes when asked.
			c.DrawnKnown([]string{tt.peer, "other"}, []Known{tt.known, {}}, false, tt.now)
			out := c.Ready()
			for _, p := range out.Ask {
				if out.Done {
					break
				}
				step := tt.self
				if p == tt.peer {
					step = tt.answer
				}
				c.Answer(p, Observation{Peer: p, Step: step}, true, tt.now)
				out = c.Ready()
			}
			if !out.Done {
				t.Fatalf("the check did not end: %+v", out)
			}
			st := out.Stats
			if st.Asked != tt.wantAsked || out.Pass != tt.wantPass || st.Slow != tt.wantSlow || st.Far != tt.wantFar || st.Cached != tt.wantCached {
				t.Errorf("asked %d pass %v slow %d far %d cached %d; want %d %v %d %d %d",
					st.Asked, out.Pass, st.Slow, st.Far, st.Cached, tt.wantAsked, tt.wantPass, tt.wantSlow, tt.wantFar, tt.wantCached)
			}
		})
	}
}

// TestJudgeUnaskedLearnsNothing: what a node knows of a peer unasked (a
// step from a model taken in a while ago) does not move the peer's record,
// whether older or newer than it: only answers teach the rule a pace.
func TestJudgeUnaskedLearnsNothing(t *testing.T) {
	// "slow" was at step 10 at 4.0 s, a step every 0.4 s; at 4.7 s its
	// record is fresh. Known at 11 then, it made that step in 0.7 s at
	// most: no bound below the rule's factor, so still slow.
	for _, step := range []Step{3, 10, 11} {
		p := NewPace(DefaultPaceConfig())
		p.SetCompute(0.1, 0.1)
		for _, o := range steady(0, 10, 0.4, 0) {
			p.Observe("slow", o.step, o.now)
		}
		before := p.Interval("slow", 4.7)
		if e := p.JudgeUnasked("slow", step, 40, 4.7); e != Slow {
			t.Errorf("step %d: %v, want slow", step, e)
		}
		if after := p.Interval("slow", 4.7); after != before {
			t.Errorf("step %d: the record's pace moved from %v to %v", step, before, after)
		}
		if e := p.JudgeUnasked("unknown", step, 40, 4.7); e != Holds {
			t.Errorf("step %d: a peer with no record: %v, want holds", step, e)
		}
	}
	// Known two steps past its record 0.1 s after it: at most 0.05 s a
	// step, within the rule's factor of the node's 0.1 s, whatever the
	// record learnt (an interval learnt across a start-up wait): asked.
	p := NewPace(DefaultPaceConfig())
	p.SetCompute(0.1, 0.1)
	for _, o := range steady(0, 10, 0.4, 0) {
		p.Observe("slow", o.step, o.now)
	}
	if e := p.JudgeUnasked("slow", 12, 40, 4.1); e != Holds {
		t.Errorf("a peer whose known steps bound its pace within the factor: %v, want holds", e)
	}
	// Through a check: a drawn peer known behind, above its record's step,
	// is judged, and its record stays as its answers made it.
	c := NewChecker(CheckConfig{Spec: Spec{Kind: PSSP, Beta: 1, Staleness: 2}, Replacements: 2, Timing: testTiming, Pace: DefaultPaceConfig()}, nil)
	for _, o := range steady(0, 10, 0.4, 0) {
		c.Pace().Observe("slow", o.step, o.now)
	}
	before := c.Pace().Interval("slow", 4.7)
	c.Start(CheckStart{Self: 40, Population: 3, Compute: 0.1, RTT: 0.001, Now: 4.7})
	c.DrawnKnown([]string{"slow"}, []Known{{Step: 11, Seen: true}}, false, 4.7)
	if out := c.Ready(); !out.Done || !out.Pass || out.Stats.Slow != 1 || out.Stats.Asked != 0 {
		t.Errorf("a slow peer known behind: %+v, want passed unasked, excused slow", out)
	}
	if after := c.Pace().Interval("slow", 4.7); after != before {
		t.Errorf("a check moved the record's pace from %v to %v", before, after)
	}
}
