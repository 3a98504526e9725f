package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pspnode/pspnode/internal/figure"
)

// writeProbes writes the tiers' measured links to links.md and links.json.
func writeProbes(out string, ps []probe) error {
	b, err := json.MarshalIndent(ps, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(out, "links.json"), b, 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(out, "links.md"), []byte(probeTable(ps)), 0o644)
}

func probeTable(ps []probe) string {
	var sb strings.Builder
	sb.WriteString("| tier | round trip asked | measured: median (min, p90) | rate asked | measured (whole transfer) | switch CPU |\n")
	sb.WriteString("|---|---|---|---|---|---|\n")
	for _, p := range ps {
		fmt.Fprintf(&sb, "| %s | %s | %.2f ms (%.2f, %.2f) | %.0f Mbit/s | %.0f Mbit/s (%.0f) | %.2f s for %.0f MB |\n", p.Tier, askedRTT(p),
			p.MedianRTTms, p.MinRTTms, p.P90RTTms, p.AskedRateMbit, p.RateMbit, p.RateAllMbit, p.SwitchCPU, p.BulkMB)
	}
	return sb.String()
}

func askedRTT(p probe) string {
	return fmt.Sprintf("%.3g ms", p.AskedRTTms)
}

// group is one system's runs on one cell, over the seeds.
type group struct {
	cell                      string // tier model slow
	tier, model, slow, system string
	runs                      []run
}

// groups gathers runs by cell and system, in the order they ran.
func groups(runs []run) []*group {
	var out []*group
	idx := map[string]*group{}
	for _, r := range runs {
		key := r.Tier + "|" + r.Model + "|" + r.Slow + "|" + r.System
		g, ok := idx[key]
		if !ok {
			g = &group{cell: r.Tier + "|" + r.Model + "|" + r.Slow, tier: r.Tier, model: r.Model, slow: r.Slow, system: r.System}
			idx[key] = g
			out = append(out, g)
		}
		g.runs = append(g.runs, r)
	}
	return out
}

// label is the system's name, with the barrier and exchange its daemons
// reported when it ran on their defaults.
func (g *group) label() string {
	l := label(g.system)
	if g.system != "default" {
		return l
	}
	var seen []string
	for _, r := range g.runs {
		if r.Settings != "" && !slices.Contains(seen, r.Settings) {
			seen = append(seen, r.Settings)
		}
	}
	if len(seen) == 0 {
		return l
	}
	return "pspnode (run defaults: " + strings.Join(seen, " | ") + ")"
}

func (g *group) spread(f func(run) float64) spread {
	var vs []float64
	for _, r := range g.runs {
		vs = append(vs, f(r))
	}
	return spreadOf(vs)
}

func (g *group) times() spread { return g.timesOf(func(r run) float64 { return r.TimeToTarget }) }

// timesOf is the spread of a time that some runs may not have reached
// (NaN): timeSpread's.
func (g *group) timesOf(f func(run) float64) spread {
	var vs []float64
	for _, r := range g.runs {
		vs = append(vs, f(r))
	}
	return timeSpread(vs)
}

// ratios pairs g's runs with another group's (DDP's, or g's system's
// without a slow worker) by seed: g's time to the target over the other's,
// where both reached it.
func (g *group) ratios(other *group) spread {
	var vs []float64
	for _, r := range g.runs {
		for _, d := range other.runs {
			if d.Seed == r.Seed && !math.IsNaN(d.TimeToTarget) && !math.IsNaN(r.TimeToTarget) && d.TimeToTarget > 0 {
				vs = append(vs, r.TimeToTarget/d.TimeToTarget)
			}
		}
	}
	return spreadOf(vs)
}

func (c *config) slowLabel(mode string) string {
	switch mode {
	case slowSleep:
		return fmt.Sprintf("%s ×%g (sleep)", count(c.slowN), c.factor)
	case slowCPU:
		return fmt.Sprintf("%s at %.3g core", count(c.slowN), c.slowCores)
	}
	return "none"
}

// count is n in words up to ten.
func count(n int) string {
	if n >= 0 && n <= 10 {
		return [...]string{"none", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"}[n]
	}
	return strconv.Itoa(n)
}

// report writes runs.json, table.md, summary.md and a figure per tier.
func (c *config) report(runs []run, probes []probe, took time.Duration) error {
	var js []run
	for _, r := range runs {
		js = append(js, r.forJSON())
	}
	b, err := json.MarshalIndent(js, "", " ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(c.out, "runs.json"), b, 0o644); err != nil {
		return err
	}
	gs := groups(runs)
	ddpOf := map[string]*group{}
	noneOf := map[string]*group{} // tier|model|system → the cell without a slow worker
	for _, g := range gs {
		if g.system == "ddp" {
			ddpOf[g.cell] = g
		}
		if g.slow == slowNone {
			noneOf[g.tier+"|"+g.model+"|"+g.system] = g
		}
	}
	vsNone := func(g *group) string {
		if none, ok := noneOf[g.tier+"|"+g.model+"|"+g.system]; ok && g.slow != slowNone {
			return ratioCell(g.ratios(none), len(g.runs)) // its time over its own none-slow time, by seed
		}
		return "—"
	}
	waits := func(g *group) string {
		if g.system == "ddp" {
			return "—"
		}
		pct := func(v float64) string { return fmt.Sprintf("%.1f %%", 100*v) }
		fast := g.spread(func(r run) float64 { f, _ := c.waitShares(r); return f })
		if fast.N == 0 {
			return "n/a"
		}
		out := fast.format(pct)
		if slow := g.spread(func(r run) float64 { _, s := c.waitShares(r); return s }); slow.N > 0 {
			out += "; slow " + slow.format(pct)
		}
		return out
	}
	var cpu, linkCPU, wall float64
	for _, r := range runs {
		cpu += r.CPUSeconds
		linkCPU += r.LinkCPU
		wall += r.Wall
	}
	cost := fmt.Sprintf("%d runs, %s of wall time in all (this invocation: %s); %.0f CPU-s in the workers' processes and %.0f in the link emulation.",
		len(runs), (time.Duration(wall) * time.Second).Round(time.Second), took.Round(time.Second), cpu, linkCPU)
	f1 := func(v float64) string { return fmt.Sprintf("%.1f", v) }
	f2 := func(v float64) string { return fmt.Sprintf("%.2f", v) }
	f3 := func(v float64) string { return fmt.Sprintf("%.3f", v) }
	f0 := func(v float64) string { return fmt.Sprintf("%.0f", v) }
	hb := func(v float64) string { return humanBytes(v) }
	timeF := func(v float64) string { return secs(v) }

	var sb strings.Builder
	fmt.Fprintf(&sb, "# torch DDP and pspnode on emulated wide-area links\n\n")
	fmt.Fprintf(&sb, "%d workers, each in its own network namespace with its own emulated link (links.md). Median over seeds %v (min–max).\n\n", c.workers, c.seeds)
	sb.WriteString("Links measured before the runs (TCP between two workers' namespaces):\n\n")
	sb.WriteString(probeTable(probes))
	fmt.Fprintf(&sb, "\n| tier | model | slow | system | go signal to %.0f %% | vs DDP (paired by seed) | vs its own none slow (paired by seed) | reached | launch to first step | launch to %.0[1]f %% | steps/s per worker | slow workers' steps/s | fast workers' time at the barrier | final accuracy | sent per worker per step | CPU s (workers) | CPU s until %.0[1]f %% | CPU s (links) | peak RSS per worker | staleness (mean, p90) | lineages at the end | load |\n", 100*c.target)
	sb.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, g := range gs {
		rt := "—"
		if d, ok := ddpOf[g.cell]; ok && g.system != "ddp" {
			rt = ratioCell(g.ratios(d), len(g.runs))
		}
		st := g.spread(func(r run) float64 { return r.SlowStepsPerS })
		slowSteps := "—"
		if st.N > 0 {
			slowSteps = st.format(f2)
		}
		fmt.Fprintf(&sb, "| %s | %s | %s | %s | %s | %s | %s | %d of %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
			g.tier, g.model, c.slowLabel(g.slow), g.label(), g.times().format(timeF), rt, vsNone(g), g.times().N, len(g.runs),
			g.timesOf(func(r run) float64 { return r.FromLaunch.FirstStep }).format(timeF),
			g.timesOf(func(r run) float64 { return r.FromLaunch.ToTarget }).format(timeF),
			g.spread(func(r run) float64 { return r.StepsPerS }).format(f2), slowSteps, waits(g),
			g.spread(func(r run) float64 { return r.FinalAccuracy }).format(f3),
			g.spread(func(r run) float64 { return r.BytesPerStep }).format(hb),
			g.spread(func(r run) float64 { return r.CPUSeconds }).format(f0),
			g.spread(func(r run) float64 { return r.CPUToTarget }).format(f1),
			g.spread(func(r run) float64 { return r.LinkCPU }).format(f0),
			g.spread(func(r run) float64 { return float64(r.PeakRSS) }).format(hb),
			g.stalenessCell(), g.lineageCell(),
			g.spread(func(r run) float64 { return r.Load }).format(f1))
	}
	fmt.Fprintf(&sb, "\n%s %s\n", c.settingsLine(), cost)
	if err := os.WriteFile(filepath.Join(c.out, "table.md"), []byte(sb.String()), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(c.out, "summary.md"), []byte(c.summary(gs, ddpOf, probes, cost)), 0o644); err != nil {
		return err
	}
	return c.figures(gs)
}

// settingsLine says how the runs were made, for the tables.
func (c *config) settingsLine() string {
	var ms []string
	for _, m := range c.models {
		switch {
		case m.Momentum > 0:
			ms = append(ms, fmt.Sprintf("%s: SGD, learning rate %g, momentum %g", m.Name, m.LR, m.Momentum))
		default:
			ms = append(ms, fmt.Sprintf("%s: SGD, learning rate %g", m.Name, m.LR))
		}
	}
	slow := ""
	for _, s := range c.slows {
		switch s {
		case slowSleep:
			slow += fmt.Sprintf(" Sleep-slowed: %s task time ×%g.", workersOf(c.slowN), c.factor)
		case slowCPU:
			slow += fmt.Sprintf(" CPU-slowed: %s processes limited to %.3g core each (cgroup cpu quota).", workersOf(c.slowN), c.slowCores)
		}
	}
	who := "Worker 0 (never the slow one) evaluates every %v during training, in either system, and its accuracy counts"
	if c.evalAll {
		who = "Every pspnode worker evaluates every %v during training and the median worker's accuracy counts (DDP: rank 0's)"
	}
	which := fmt.Sprintf("The slow worker is worker 1 + (seed − 1) mod %d.", c.workers-1)
	if c.slowN > 1 {
		which = fmt.Sprintf("The slow workers are the %d from worker 1 + (seed − 1) mod %d on, among workers 1–%d.", c.slowN, c.workers-1, c.workers-1)
	}
	return fmt.Sprintf("Task time (Exp(1)+1)·%g s per step, batch %d; %s. "+who+"; every worker evaluates once at the end (final accuracy: their mean). A run stops %v after the target of %.0f %% was reached, or after %v of training.%s %s",
		c.scale, c.batch, strings.Join(ms, "; "), c.evalEvery, c.after, 100*c.target, c.maxDur, slow, which)
}

// workersOf is "one worker's" or "two workers'".
func workersOf(n int) string {
	if n == 1 {
		return "one worker's"
	}
	return count(n) + " workers'"
}

// loadRange is the range of the 1-minute load average at the runs' ends.
func loadRange(gs []*group) string {
	var ls []float64
	for _, g := range gs {
		for _, r := range g.runs {
			ls = append(ls, r.Load)
		}
	}
	s := spreadOf(ls)
	return fmt.Sprintf("%.1f–%.1f (median %.1f) on %d cores", s.Min, s.Max, s.Median, runtime.NumCPU())
}

// ratioCell is a cell's ratios to DDP, saying how many seeds they are
// over when some run did not reach the target.
func ratioCell(s spread, seeds int) string {
	if s.N == 0 {
		return "—"
	}
	out := s.format(func(v float64) string { return fmt.Sprintf("%.2f×", v) })
	if s.N < seeds {
		out += fmt.Sprintf(" (%d of %d seeds)", s.N, seeds)
	}
	return out
}

func (g *group) stalenessCell() string {
	if g.system == "ddp" {
		return "0 (synchronous)"
	}
	var means, p90s []float64
	na := 0
	for _, r := range g.runs {
		if r.Staleness == nil || r.Staleness.Mean == nil {
			na++
			continue
		}
		means = append(means, *r.Staleness.Mean)
		p90s = append(p90s, ptrNaN(r.Staleness.P90))
	}
	if len(means) == 0 {
		return "n/a"
	}
	s := spreadOf(means).format(func(v float64) string { return fmt.Sprintf("%.2f", v) }) + ", " +
		spreadOf(p90s).format(func(v float64) string { return fmt.Sprintf("%.1f", v) })
	if na > 0 {
		s += fmt.Sprintf(" (%d runs n/a)", na)
	}
	return s
}

func (g *group) lineageCell() string {
	if g.system == "ddp" {
		return "—"
	}
	forked, unread := 0, 0
	for _, r := range g.runs {
		if r.Forked {
			forked++
		}
		if distinct(r.Lineages) == 0 {
			unread++
		}
	}
	switch {
	case forked > 0:
		return fmt.Sprintf("**%d of %d runs forked**", forked, len(g.runs))
	case unread == len(g.runs):
		return "unread"
	}
	return "one"
}

// summary is a block for docs/results.md: the links, and per cell DDP's
// and pspnode's times and their ratio.
func (c *config) summary(gs []*group, ddpOf map[string]*group, probes []probe, cost string) string {
	var sb strings.Builder
	sb.WriteString("Emulated links (each worker in its own network namespace; measured between two of them before the runs):\n\n")
	sb.WriteString(probeTable(probes))
	fmt.Fprintf(&sb, "\n%d workers; time to %.0f %% held-out accuracy, median over seeds %v (min–max); pspnode over DDP paired by seed.\n\n", c.workers, 100*c.target, c.seeds)
	sb.WriteString("| tier | model | slow | system | time to target | vs DDP | steps/s per worker | sent per worker per step | CPU s (workers) | staleness (mean, p90) |\n")
	sb.WriteString("|---|---|---|---|---|---|---|---|---|---|\n")
	for _, g := range gs {
		rt := "—"
		if d, ok := ddpOf[g.cell]; ok && g.system != "ddp" {
			rt = ratioCell(g.ratios(d), len(g.runs))
		}
		fmt.Fprintf(&sb, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", g.tier, g.model, c.slowLabel(g.slow), g.label(),
			g.times().format(secs), rt, g.spread(func(r run) float64 { return r.StepsPerS }).format(func(v float64) string { return fmt.Sprintf("%.2f", v) }),
			g.spread(func(r run) float64 { return r.BytesPerStep }).format(humanBytes),
			g.spread(func(r run) float64 { return r.CPUSeconds }).format(func(v float64) string { return fmt.Sprintf("%.0f", v) }),
			g.stalenessCell())
	}
	var forked []string
	for _, g := range gs {
		for _, r := range g.runs {
			if r.Forked {
				forked = append(forked, fmt.Sprintf("%s %s %s seed %d", r.Tier, r.Model, r.Slow, r.Seed))
			}
		}
	}
	if len(forked) > 0 {
		fmt.Fprintf(&sb, "\nRuns whose daemons ended on more than one lineage: %s.\n", strings.Join(forked, "; "))
	}
	fmt.Fprintf(&sb, "\n%s\n\nCost: %s Load average at the runs' ends: %s.\n", c.settingsLine(), cost, loadRange(gs))
	return sb.String()
}

// figures draws one PNG per tier: a panel per model and slow mode, a line
// per system (the median over seeds of the accuracy that counts).
func (c *config) figures(gs []*group) error {
	for _, t := range c.tiers {
		var panels []figure.Panel
		for _, m := range c.models {
			for _, s := range c.slows {
				p := figure.Panel{Options: figure.Options{Title: fmt.Sprintf("%s, %s, slow: %s", t.Name, m.Name, c.slowLabel(s)),
					XLabel: "seconds", YLabel: "held-out accuracy", LegendBottom: true}}
				for _, g := range gs {
					if g.tier == t.Name && g.model == m.Name && g.slow == s {
						p.Series = append(p.Series, seedMedian(g.label(), g.runs))
					}
				}
				if len(p.Series) > 0 {
					panels = append(panels, p)
				}
			}
		}
		if len(panels) == 0 {
			continue
		}
		if err := figure.Grid(filepath.Join(c.out, "accuracy_"+t.Name+".png"), len(c.slows), panels...); err != nil {
			return err
		}
	}
	return nil
}

// seedMedian is the median over runs of their curves at each time point
// that any run reached.
func seedMedian(name string, runs []run) figure.Series {
	at := map[float64][]float64{}
	for _, r := range runs {
		for _, p := range r.Curve {
			at[p[0]] = append(at[p[0]], p[1])
		}
	}
	var ts []float64
	for t := range at {
		ts = append(ts, t)
	}
	slices.Sort(ts)
	s := figure.Series{Name: name}
	for _, t := range ts {
		s.X = append(s.X, t)
		s.Y = append(s.Y, spreadOf(at[t]).Median)
	}
	return s
}
