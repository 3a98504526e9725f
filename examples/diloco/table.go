package main

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

func secsP(s *float64) string {
	if s == nil {
		return "not reached"
	}
	return fmt.Sprintf("%.1f s", *s)
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// writeTable writes the medians over seeds of each tier, slow setting and
// system, and their ratios to the first system's and DDP's.
func (c *config) writeTable(runs []run, took time.Duration) error {
	var sb strings.Builder
	fmt.Fprintf(&sb, "# DiLoCo under pspnode, beside a blocking all-reduce and DDP\n\n")
	fmt.Fprintf(&sb, "`go run ./examples/diloco %s` (%s). %d workers, %d steps each, H = %d, batch %d, sleep %g s per step, "+
		"a fast worker's CPU quota %g cores, a slow one slowed ×%g; AdamW at %g (DiLoCo's inner) and %g (DDP, psp); medians over seeds %v. Target: held-out loss %.2f.\n\n",
		strings.Join(os.Args[1:], " "), took.Round(time.Second), c.workers, c.steps, c.h, c.batch, c.sleep, c.quota, c.factor, c.lr, c.ddpLR, c.seeds, c.target)
	fmt.Fprintf(&sb, "| tier | slow | system | bytes per sample | vs DDP | on the wire | sent per worker to target | time to target | vs DDP | vs all-reduce | final loss | CPU s | peak RSS per worker | load |\n")
	fmt.Fprintf(&sb, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	type cell struct {
		tier, sys string
		slow      int
	}
	var order []cell
	groups := map[cell][]run{}
	for _, r := range runs {
		k := cell{r.Tier, r.System, r.Slow}
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], r)
	}
	med := func(rs []run, f func(run) float64) float64 {
		var v []float64
		for _, r := range rs {
			v = append(v, f(r))
		}
		return median(v)
	}
	ttt := func(r run) float64 {
		if r.TimeToTarget == nil {
			return math.Inf(1)
		}
		return *r.TimeToTarget
	}
	for _, k := range order {
		rs := groups[k]
		bps, t, fl := med(rs, func(r run) float64 { return r.BytesPerSample }), med(rs, ttt), med(rs, func(r run) float64 { return r.FinalLoss })
		cpu, rss, load := med(rs, func(r run) float64 { return r.CPUSeconds }), med(rs, func(r run) float64 { return float64(r.PeakRSS) }), med(rs, func(r run) float64 { return r.Load })
		ratio := func(other string, f func(run) float64, x float64, inv bool) string {
			o, ok := groups[cell{k.tier, other, k.slow}]
			if !ok || other == k.sys {
				return "—"
			}
			y := med(o, f)
			if inv {
				return fmt.Sprintf("%.0f× fewer", y/x)
			}
			if math.IsInf(x, 1) || math.IsInf(y, 1) {
				return "—"
			}
			return fmt.Sprintf("%.2f×", x/y)
		}
		tt, toTarget := "not reached", "—"
		if !math.IsInf(t, 1) {
			tt = fmt.Sprintf("%.0f s", t)
			toTarget = human(med(rs, func(r run) float64 { return r.BytesPerSample * float64(r.StepAtTarget*c.batch) }))
		}
		wire := "—"
		if w := med(rs, func(r run) float64 { return float64(r.WireBytes) / float64(max(r.Samples, 1)) }); w >= 0 {
			wire = human(w)
		}
		fmt.Fprintf(&sb, "| %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %.3f | %.0f | %s | %.1f |\n", k.tier, k.slow, k.sys,
			human(bps), ratio("ddp", func(r run) float64 { return r.BytesPerSample }, bps, true), wire, toTarget, tt,
			ratio("ddp", ttt, t, false), ratio("allreduce", ttt, t, false), fl, cpu, human(rss), load)
	}
	return os.WriteFile(filepath.Join(c.out, "table.md"), []byte(sb.String()), 0o644)
}

func human(b float64) string {
	switch {
	case b >= 1<<30:
		return fmt.Sprintf("%.2f GB", b/(1<<30))
	case b >= 1<<20:
		return fmt.Sprintf("%.1f MB", b/(1<<20))
	case b >= 1<<10:
		return fmt.Sprintf("%.1f kB", b/(1<<10))
	}
	return fmt.Sprintf("%.0f B", b)
}
