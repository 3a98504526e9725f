package plan

import (
	"testing"
	"time"

	"github.com/pspnode/pspnode/node/exchange"
	"github.com/pspnode/pspnode/psp"
)

func TestEstimate(t *testing.T) {
	base := DefaultConfig()
	base.Model = "none"
	base.Exchange = exchange.Spec{} // gossip
	with := func(f func(*Config)) Config { c := base; f(&c); return c }
	const logreg = 7850 // MNIST logistic regression
	for _, tc := range []struct {
		name          string
		small, large  Config
		params        int
		moreMem, more bool // large needs more memory, more CPU
	}{
		{"nodes", with(func(c *Config) { c.Nodes = 50 }), with(func(c *Config) { c.Nodes = 500 }), 0, true, true},
		{"duration", base, with(func(c *Config) { c.Duration = 10 * time.Minute }), 0, false, true},
		{"gossip over epidemic", with(func(c *Config) { c.Exchange = exchange.Spec{Kind: exchange.Epidemic, S: 4} }), base, logreg, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, l := EstimateRun(tc.small, tc.params, 2), EstimateRun(tc.large, tc.params, 2)
			if (l.RSSBytes > s.RSSBytes) != tc.moreMem || !(l.CPUS > s.CPUS) == tc.more || !(s.WallS > 0) {
				t.Errorf("small %+v, large %+v", s, l)
			}
		})
	}
	// Gossip with a model grows with N², epidemic with N.
	g := func(n int, ex exchange.Spec) float64 {
		return EstimateRun(with(func(c *Config) { c.Nodes, c.Exchange = n, ex }), logreg, 2).RSSBytes
	}
	gossip, epi := exchange.Spec{}, exchange.Spec{Kind: exchange.Epidemic, S: 4}
	if r := g(400, gossip) / g(100, gossip); r < 10 {
		t.Errorf("gossip memory grew %.1f× from 100 to 400 nodes, want about 16×", r)
	}
	if r := g(400, epi) / g(100, epi); r > 5 {
		t.Errorf("epidemic memory grew %.1f× from 100 to 400 nodes, want about 4×", r)
	}
}

// The CPU estimate is within 1.6× of runs measured on main (2 cores, idle
// machine, virtual clock, no model unless named), and the memory estimate
// at or above their peak RSS, by at most 1.7×.
func TestEstimateFitsMeasuredRuns(t *testing.T) {
	run := func(nodes int, barrier string, d time.Duration, scale float64) Config {
		c := DefaultConfig()
		c.Nodes, c.Barrier, c.Duration, c.TimeScale, c.Model = nodes, psp.MustParse(barrier), d, scale, "none"
		return c
	}
	gc := func(c Config, percent int) Config { c.GCPercent = percent; return c }
	for _, tc := range []struct {
		name     string
		cfg      Config
		params   int
		measured float64 // CPU-seconds
		rssGiB   float64 // peak RSS (0: not held to it)
	}{
		{"200 nodes pBSP(10) 100 s", run(200, "pbsp:10", 100*time.Second, 1), 0, 80.9, 1.41},
		{"200 nodes pSSP(10,4) 100 s", run(200, "pssp:10:4", 100*time.Second, 1), 0, 42.1, 1.06},
		{"400 nodes pBSP(10) 20 s", run(400, "pbsp:10", 20*time.Second, 1), 0, 87.1, 2.76},
		{"1000 nodes pBSP(10) 20 s at 0.2", run(1000, "pbsp:10", 20*time.Second, 0.2), 0, 805.0, 5.16},
		{"1000 nodes pSSP(10,4) 60 s at 0.2", run(1000, "pssp:10:4", 60*time.Second, 0.2), 0, 891.0, 5.28},
		{"2000 nodes pSSP(10,4) 60 s at 0.2", run(2000, "pssp:10:4", 60*time.Second, 0.2), 0, 2209.0, 11.87},
		{"1000 nodes pSSP(10,4) 30 s at 0.2", run(1000, "pssp:10:4", 30*time.Second, 0.2), 0, 506.0, 4.90},
		{"1000 nodes pSSP(10,4) 30 s at 0.2, GOGC 50", gc(run(1000, "pssp:10:4", 30*time.Second, 0.2), 50), 0, 670.0, 3.87},
		{"make run (linreg, 21 parameters)", DefaultConfig(), 21, 4.8, 0},
	} {
		e := EstimateRun(tc.cfg, tc.params, 2)
		if r := e.CPUS / tc.measured; r > 1.6 || r < 1/1.6 {
			t.Errorf("%s: estimate %.1f CPU-seconds, measured %.1f (%.2f×)", tc.name, e.CPUS, tc.measured, r)
		}
		// The memory estimate decides refusals: it may err high, not low.
		if r := e.RSSBytes / (tc.rssGiB * (1 << 30)); tc.rssGiB > 0 && (r < 1 || r > 1.7) {
			t.Errorf("%s: estimate %.2f GiB, measured %.2f GiB (%.2f×)", tc.name, e.RSSBytes/(1<<30), tc.rssGiB, r)
		}
	}
}

// The memory estimate follows the collector's target: fitted at the
// testnet's default for N, less memory for a lower target, more for a
// higher one.
func TestEstimateFollowsGCPercent(t *testing.T) {
	for _, nodes := range []int{200, 1000} {
		c := DefaultConfig()
		c.Nodes, c.Model = nodes, "none"
		rss := func(p int) float64 { c.GCPercent = p; return EstimateRun(c, 0, 2).RSSBytes }
		def := rss(0)
		if d := rss(DefaultGCPercent(nodes)); d != def {
			t.Errorf("%d nodes: the default target set explicitly estimates %.0f, unset %.0f", nodes, d, def)
		}
		if lo, hi := rss(50), rss(400); !(lo < def && def < hi) {
			t.Errorf("%d nodes: estimates %.2f, %.2f, %.2f GiB at GOGC 50, default, 400: want increasing", nodes, lo/(1<<30), def/(1<<30), hi/(1<<30))
		}
	}
}
