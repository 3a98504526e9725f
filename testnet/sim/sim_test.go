package sim

import (
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/pspnode/pspnode/psp"
)

func run(t *testing.T, spec string, mod func(*Config)) *Result {
	t.Helper()
	c := DefaultConfig()
	c.Nodes, c.Duration = 60, 80
	c.Barrier = psp.MustParse(spec)
	if mod != nil {
		mod(&c)
	}
	r, err := Run(c)
	if err != nil {
		t.Fatalf("Run(%s): %v", spec, err)
	}
	return r
}

func TestDeterministic(t *testing.T) {
	for _, spec := range []string{"asp", "bsp", "pssp:5:2", "dssp:1:4", "pdssp:5:1:4"} {
		a := run(t, spec, func(c *Config) { c.LeaveRate, c.JoinRate, c.Stragglers = 0.1, 0.1, 0.2 })
		b := run(t, spec, func(c *Config) { c.LeaveRate, c.JoinRate, c.Stragglers = 0.1, 0.1, 0.2 })
		if !reflect.DeepEqual(a, b) {
			t.Errorf("%s: two runs of one config differ", spec)
		}
		c := run(t, spec, func(c *Config) { c.LeaveRate, c.JoinRate, c.Stragglers, c.Seed = 0.1, 0.1, 0.2, 99 })
		if reflect.DeepEqual(a.FinalSteps, c.FinalSteps) {
			t.Errorf("%s: another seed gave the same final steps", spec)
		}
	}
}

// The barriers' identities (pBSP(0) = ASP, pBSP(β ≥ P−1) = BSP, pSSP(β ≥
// P−1, s) = SSP(s), ...), at the level of whole runs: with common random
// numbers, runs that must decide identically end identically. Those of
// the paper's barriers hold with the pace rule off; with it on, those
// that do not set a sampled barrier beside a global one (which has no
// pace rule) hold too.
func TestIdentities(t *testing.T) {
	n := 40
	for _, tc := range []struct {
		a, b string
		pace bool // the identity holds with the pace rule on too
	}{
		{"pbsp:0", "asp", true},
		{"pssp:0:3", "asp", true},
		{"pbsp:39", "bsp", false},     // β = P-1: everyone else is sampled
		{"pbsp:500", "bsp", false},    // β > P
		{"pssp:39:3", "ssp:3", false}, // β = P-1
		{"pssp:7:0", "pbsp:7", true},  // s = 0
		{"ssp:0", "bsp", true},
		{"ssp:1000000", "asp", true}, // s = ∞
		{"dssp:3:3", "ssp:3", true},  // no dynamic range
	} {
		for _, pace := range []psp.PaceConfig{{}, psp.DefaultPaceConfig()} {
			if pace.On() && !tc.pace {
				continue
			}
			mod := func(c *Config) { c.Nodes, c.Pace = n, pace }
			a, b := run(t, tc.a, mod), run(t, tc.b, mod)
			if !reflect.DeepEqual(a.FinalSteps, b.FinalSteps) {
				t.Errorf("%s and %s (pace %s) should end identically: %v vs %v", tc.a, tc.b, pace, a.Steps, b.Steps)
			}
		}
	}
}

func TestBarrierSpreads(t *testing.T) {
	for _, tc := range []struct {
		spec      string
		maxSpread float64
	}{
		{"bsp", 1},   // every node within one step of the slowest
		{"ssp:4", 5}, // within s+1
		{"ssp:2", 3},
		{"dssp:2:5", 6}, // within S_U+1
	} {
		r := run(t, tc.spec, func(c *Config) { c.Stragglers = 0.2 })
		if spread := r.Steps.Max - r.Steps.Min; spread > tc.maxSpread {
			t.Errorf("%s: spread %v exceeds %v", tc.spec, spread, tc.maxSpread)
		}
		if r.Steps.Min < 3 {
			t.Errorf("%s: made almost no progress: %+v", tc.spec, r.Steps)
		}
	}
}

func TestPaperOrdering(t *testing.T) {
	// The shape of the paper's step experiment: BSP slowest, ASP fastest,
	// SSP and the probabilistic barriers in between; pBSP tighter than ASP.
	mean := map[string]Stats{}
	for _, s := range []string{"asp", "bsp", "ssp:4", "pbsp:10", "pssp:10:4"} {
		mean[s] = run(t, s, nil).Steps
	}
	if !(mean["bsp"].Mean < mean["ssp:4"].Mean && mean["ssp:4"].Mean < mean["asp"].Mean) {
		t.Errorf("want BSP < SSP < ASP, got %v", mean)
	}
	if !(mean["bsp"].Mean < mean["pbsp:10"].Mean && mean["pbsp:10"].Mean < mean["pssp:10:4"].Mean &&
		mean["pssp:10:4"].Mean <= mean["asp"].Mean) {
		t.Errorf("want BSP < pBSP < pSSP <= ASP, got %v", mean)
	}
	if mean["pbsp:10"].StdDev >= mean["asp"].StdDev {
		t.Errorf("pBSP spread %v should be below ASP's %v", mean["pbsp:10"].StdDev, mean["asp"].StdDev)
	}
}

func TestBetaSweepMonotone(t *testing.T) {
	prev := math.Inf(1)
	for _, b := range []int{0, 1, 2, 4, 8, 16, 32} {
		r := run(t, "pbsp:"+itoa(b), nil)
		if r.Steps.Mean > prev+0.5 {
			t.Errorf("pbsp:%d mean %v above smaller β's %v", b, r.Steps.Mean, prev)
		}
		prev = r.Steps.Mean
	}
}

func TestChurnStallsGlobalNotProbabilistic(t *testing.T) {
	churn := func(c *Config) {
		c.Duration = 150
		c.LeaveRate, c.JoinRate, c.ChurnMode = 0.2, 0.2, Crash
	}
	bsp := run(t, "bsp", churn)
	if bsp.Crashed == 0 || bsp.Joined == 0 {
		t.Fatalf("no churn happened: %+v", bsp)
	}
	if bsp.StalledNodes == 0 {
		t.Errorf("BSP with crashed nodes in its view should stall; final steps %+v", bsp.Steps)
	}
	for _, s := range []string{"pbsp:10", "pssp:10:4", "pdssp:10:2:6"} {
		r := run(t, s, churn)
		if r.StalledNodes != 0 {
			t.Errorf("%s stalled %d nodes under churn", s, r.StalledNodes)
		}
		if r.Steps.P50 < 2*bsp.Steps.P50 {
			t.Errorf("%s median step %v should far exceed stalled BSP's %v", s, r.Steps.P50, bsp.Steps.P50)
		}
	}
	// Graceful leavers are removed from the view: BSP keeps going.
	g := run(t, "bsp", func(c *Config) { churn(c); c.ChurnMode = Graceful })
	if g.StalledNodes != 0 || g.Left == 0 {
		t.Errorf("BSP under graceful churn: stalled %d, left %d", g.StalledNodes, g.Left)
	}
}

func TestPollModeCloseToFidelity(t *testing.T) {
	f := run(t, "pbsp:10", nil)
	p := run(t, "pbsp:10", func(c *Config) { c.Mode, c.PollInterval = Poll, 0.05 })
	if rel := math.Abs(p.Steps.Mean-f.Steps.Mean) / f.Steps.Mean; rel > 0.1 {
		t.Errorf("poll mean %v vs fidelity %v: %.0f%% apart", p.Steps.Mean, f.Steps.Mean, 100*rel)
	}
}

func TestStragglers(t *testing.T) {
	r := run(t, "asp", func(c *Config) { c.Stragglers, c.StraggleFactor = 0.25, 4 })
	n := 0
	for _, f := range r.Factors {
		if f == 4 {
			n++
		}
	}
	if n != 15 {
		t.Errorf("want 15 stragglers of 60, got %d", n)
	}
	// Under ASP a straggler completes about a quarter as many steps.
	var fast, slow float64
	for i, s := range r.FinalSteps {
		if r.Factors[i] == 4 {
			slow += float64(s) / 15
		} else {
			fast += float64(s) / 45
		}
	}
	if ratio := fast / slow; ratio < 3 || ratio > 5 {
		t.Errorf("fast/straggler step ratio %v, want about 4", ratio)
	}
}

func TestRecording(t *testing.T) {
	r := run(t, "pssp:10:4", func(c *Config) { c.RecordEvery = 10 })
	if len(r.Times) != 9 || len(r.Series) != 9 {
		t.Fatalf("want 9 snapshots at 0,10..80, got %d", len(r.Times))
	}
	last := r.Series[len(r.Series)-1]
	for i := range last {
		if last[i] > r.FinalSteps[i] || (i > 0 && r.Series[0][i] != 0) {
			t.Fatalf("series inconsistent at node %d", i)
		}
	}
	if r.Lag.Updates == 0 || r.Lag.Mean <= 0 || !(r.Lag.F > 0 && r.Lag.F <= 1) || !r.Lag.BoundOK {
		t.Errorf("lag not recorded: %+v", r.Lag)
	}
	b := run(t, "bsp", nil)
	if b.Lag.Mean >= r.Lag.Mean || b.Lag.Mean > 1 {
		t.Errorf("BSP lag %v should be below 1 step and below pSSP's %v", b.Lag.Mean, r.Lag.Mean)
	}
	if b.WaitFraction <= r.WaitFraction {
		t.Errorf("BSP should wait more than pSSP: %v vs %v", b.WaitFraction, r.WaitFraction)
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		mod  func(*Config)
		want string
	}{
		{func(c *Config) { c.Nodes = 0 }, "nodes"},
		{func(c *Config) { c.Duration = math.NaN() }, "duration"},
		{func(c *Config) { c.Barrier = psp.Spec{} }, "barrier"},
		{func(c *Config) { c.Stragglers = 1.5 }, "stragglers"},
		{func(c *Config) { c.StraggleFactor = 0.5 }, "straggle factor"},
		{func(c *Config) { c.Mode, c.PollInterval = Poll, 0 }, "poll interval"},
		{func(c *Config) { c.LeaveRate = -1 }, "churn"},
		{func(c *Config) { c.TimeScale = 0 }, "time scale"},
	} {
		c := DefaultConfig()
		tc.mod(&c)
		if _, err := Run(c); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("want an error naming %q, got %v", tc.want, err)
		}
	}
}

func itoa(i int) string { return psp.Spec{Kind: psp.PBSP, Beta: i}.String()[5:] }

// BenchmarkPaperStepExperiment runs the paper's step experiment (200 nodes,
// 200 s) for the five barriers; the issue asks for under 5 s in total.
func BenchmarkPaperStepExperiment(b *testing.B) {
	for range b.N {
		for _, s := range []string{"asp", "bsp", "ssp:4", "pbsp:10", "pssp:10:4"} {
			c := DefaultConfig()
			c.Barrier = psp.MustParse(s)
			if _, err := Run(c); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// BenchmarkPoll10k is 10 000 nodes × 200 s of pBSP(10) in poll mode; the
// issue asks for under 60 s.
func BenchmarkPoll10k(b *testing.B) {
	for range b.N {
		c := DefaultConfig()
		c.Nodes, c.Mode, c.Barrier = 10000, Poll, psp.MustParse("pbsp:10")
		if _, err := Run(c); err != nil {
			b.Fatal(err)
		}
	}
}

// Timed mode runs the nodes' whole barrier policy, re-check timing and
// progress wakes included. Its re-check interval, c/N̂, is the mean time
// between completions, so its figures stay near the paper's simulator's
// (fidelity). Not at one: pBSP(10) at 50 nodes and time scale 0.2 ends
// at a mean step of 68.5 in timed mode and 60.8 in fidelity mode; the
// testnet's nodes (seed 7) reach 67.8.
func TestTimedModeNearFidelity(t *testing.T) {
	for _, spec := range []string{"pbsp:10", "pssp:10:4", "bsp", "ssp:4", "pdssp:5:1:4"} {
		mod := func(m Mode) func(*Config) {
			return func(c *Config) { c.Nodes, c.Duration, c.TimeScale, c.Mode = 50, 40, 0.2, m }
		}
		f, tm := run(t, spec, mod(Fidelity)), run(t, spec, mod(Timed))
		if tm.Mode != "timed" {
			t.Errorf("%s: mode %q", spec, tm.Mode)
		}
		if d := math.Abs(tm.Steps.Mean/f.Steps.Mean - 1); d > 0.15 {
			t.Errorf("%s: timed mean step %.1f, fidelity %.1f (%.1f %% apart)", spec, tm.Steps.Mean, f.Steps.Mean, 100*d)
		}
		if again := run(t, spec, mod(Timed)); !reflect.DeepEqual(tm, again) {
			t.Errorf("%s: two timed runs of one config differ", spec)
		}
	}
	c := DefaultConfig()
	c.Barrier, c.Mode = psp.MustParse("dssp:1:4"), Timed
	if c.Validate() == nil {
		t.Error("timed mode accepted the server-based DSSP")
	}
}

// With Replace every leave brings a node in at once: the population holds,
// whatever the leaves. Without it the joins are a process of their own.
func TestChurnReplaceHoldsPopulation(t *testing.T) {
	for _, tc := range []struct {
		name    string
		replace bool
	}{{"independent", false}, {"replace", true}} {
		t.Run(tc.name, func(t *testing.T) {
			r := run(t, "pssp:10:4", func(c *Config) {
				c.Duration = 300
				c.LeaveRate, c.JoinRate, c.ChurnMode, c.Replace = 0.5, 0.5, Mixed, tc.replace
			})
			gone := r.Left + r.Crashed
			if gone < 50 {
				t.Fatalf("only %d departures: pick a higher rate", gone)
			}
			held := r.Joined == gone && r.Live == 60
			if held != tc.replace {
				t.Errorf("replace %v: %d departures, %d joins, %d live of 60", tc.replace, gone, r.Joined, r.Live)
			}
		})
	}
}
