package report

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
)

// OverloadWarning is the line a flagged real-clock run prints: what
// happened and what to do. Empty when the run was not flagged.
func (r *Result) OverloadWarning() string {
	if r.Overload == nil || !r.Overload.Flagged {
		return ""
	}
	return fmt.Sprintf("WARNING: this machine set the pace of the %s run (%s): its figures are the machine's, not the protocol's. "+
		"Use --clock virtual, fewer nodes, or a larger --time-scale.", r.Barrier, r.Overload.Reason)
}

// PrintSummary writes a human-readable summary table.
func (r *Result) PrintSummary(w0 io.Writer) {
	tw := tabwriter.NewWriter(w0, 0, 0, 2, ' ', 0)
	row := func(k, format string, a ...any) { fmt.Fprintf(tw, "%s\t%s\n", k, fmt.Sprintf(format, a...)) }
	row("barrier", "%s (%s clock, %s transport, model %s, exchange %s, time scale %g, seed %d)", r.Barrier, r.Clock, r.Transport, r.Model, r.Exchange, r.TimeScale, r.Seed)
	row("nodes", "%d at start, %d live at the end (%d joined, %d left, %d crashed)", r.Nodes, r.LiveNodes, r.Joined, r.Left, r.Crashed)
	if r.JoinS != nil {
		row("  joins", "p50 %.2f s, p99 %.2f s from a join's start to its first step", r.JoinS.P50, r.JoinS.P99)
	}
	switch {
	case r.Clock == "virtual" && r.WallS > 0:
		row("duration", "%.1f s of training (virtual) after %.1f s of warm-up; %.1f s of wall time (%.2f× real time)", r.DurationS, r.WarmupS, r.WallS, r.VirtualPerWall)
	default:
		row("duration", "%.1f s of training after %.1f s of warm-up", r.DurationS, r.WarmupS)
	}
	row("steps", "min %.0f  p5 %.0f  p50 %.0f  mean %.1f  p95 %.0f  max %.0f  (stddev %.2f)", r.Steps.Min, r.Steps.P5, r.Steps.P50, r.Steps.Mean, r.Steps.P95, r.Steps.Max, r.Steps.StdDev)
	if r.FastSteps != nil {
		row("  fast / stragglers", "mean %.1f / %.1f", r.FastSteps.Mean, r.StragglerSteps.Mean)
	}
	row("stalled nodes", "%d", r.StalledNodes)
	row("population error", "median %.1f %%, p95 %.1f %%", 100*r.Population.MedianRelError, 100*r.Population.P95RelError)
	if u := r.Population.Used; u != nil {
		row("  used", "median %.1f %%, p95 %.1f %% over the run; largest %.4g, worst %.3g× off (what the nodes' learning rates and /status use)", 100*u.MedianRelError, 100*u.P95RelError, u.Max, u.WorstFactor)
	}
	if r.Sampling.Peers > 0 {
		row("sampling", "max/mean %.2f, min/mean %.2f, chi-square p %.3g over %d draws of %d peers", r.Sampling.MaxOverMean, r.Sampling.MinOverMean, r.Sampling.Chi2P, r.Sampling.Draws, r.Sampling.Peers)
	}
	row("barrier wait", "p50 %.2f ms, p99 %.1f ms", r.BarrierWaitMs.P50, r.BarrierWaitMs.P99)
	row("barrier check", "p50 %.2f ms, p99 %.1f ms (one decision: sample, query, decide)", r.BarrierCheckMs.P50, r.BarrierCheckMs.P99)
	if e := r.BarrierExcused; e.Slow+e.Far > 0 {
		row("  excused", "%d slow and %d far-behind peers not waited for (the pace rule)", e.Slow, e.Far)
	}
	row("sample RTT", "p50 %.2f ms, p99 %.1f ms", r.SampleRTTMs.P50, r.SampleRTTMs.P99)
	declined := ""
	if r.Updates.Declined > 0 {
		declined = fmt.Sprintf(", %d declined at their offer%s", r.Updates.Declined, reasonList(r.Updates.DeclinedByReason))
	}
	row("updates", "%d sent, %d received, %d rejected%s%s, %.0f bytes each", r.Updates.Sent, r.Updates.Received, r.Updates.Rejected, reasonList(r.Updates.ByReason), declined, r.Updates.BytesPerUpdate)
	if a := r.Accuracy; a != nil {
		tt := "not reached"
		if a.TimeToTarget != nil {
			tt = fmt.Sprintf("%.0f s", *a.TimeToTarget)
		}
		row(a.Metric, "final %.4f (loss %.4f); %.2f reached: %s", a.Final, a.FinalLoss, a.Target, tt)
	}
	if tr := r.Traffic; tr != nil {
		amp := ""
		if tr.GossipAmplification > 0 {
			amp = fmt.Sprintf("; gossip amplification %.2f", tr.GossipAmplification)
		}
		row("traffic", "per node %.0f B/s in, %.0f B/s out; %.0f B in per step%s", tr.InBytesPerNodeS, tr.OutBytesPerNodeS, tr.InBytesPerStep, amp)
	}
	row("connections", "%.1f held per node (at most %d), %.1f opened per node per minute, %.2f step dials per check", r.Connections.HeldMean, r.Connections.HeldMax, r.Connections.OpenedPerNodeMin, r.Connections.DialsPerCheck)
	row("defences", "%d step reports screened, %d updates refused by norm, %d streams refused, %d step queries failed", r.Defences.ReportsScreened, r.Defences.UpdatesNormRefused, r.Defences.StreamsRefused, r.Defences.StepQueriesFailed)
	row("log", "%d warnings (%.1f KiB as text lines)", r.LogWarnings.Lines, float64(r.LogWarnings.Bytes)/1024)
	if h := r.Hostile; h != nil {
		row("hostile", "%s; figures above are of the %d honest live nodes", h.Roles, h.HonestNodes)
		row("  poison", "%d invalid updates applied, %d large-norm updates delivered (then refused by norm)", h.PoisonApplied, h.NormPoisonDelivered)
		if tg := h.Target; tg != nil {
			row("  flood target", "%d steps against an honest mean of %.1f; %d streams refused (%d step, %d model); held live by %d of %d honest peers",
				tg.Steps, tg.HonestMeanSteps, tg.StreamsRefused, tg.StepStreamsRefused, tg.ModelStreamsRefused, tg.HeldLiveBy, tg.HonestPeers)
		}
		if h.SybilFigures != nil {
			h.SybilFigures.print(row)
		}
		if h.FakePeersNamed > 0 {
			row("  fake peers", "%d made-up peers named in DHT replies", h.FakePeersNamed)
		}
		h.printImpostors(row)
		if h.Hogs != nil {
			h.Hogs.print(row)
		}
	}
	if mb := r.Membership; mb != nil {
		sample := "not timed"
		if mb.SampleUs > 0 {
			sample = fmt.Sprintf("%.2f µs a call", mb.SampleUs)
		}
		row("membership", "%.1f members per honest node (max %d), %.1f unconfirmed (max %d), %.1f dead, %.1f drawable; Sample %s",
			mb.Members, mb.MembersMax, mb.Unconfirmed, mb.UnconfirmedMax, mb.Dead, mb.Drawable, sample)
	}
	row("resources", "peak RSS %.0f MiB, CPU %.1f s (this run)", float64(r.PeakRSSBytes)/(1<<20), r.CPUS)
	if c := r.Cost; c != nil {
		row("cost", "%.1f paper node-seconds per CPU-second, %.2f MiB per node, %.1f connections held and %.1f opened a minute per node",
			c.PaperNodeSPerCPUS, c.RSSBytesPerNode/(1<<20), c.ConnectionsHeldPerNode, c.ConnectionsOpenedPerNode)
	}
	if rs := r.Resources; rs != nil {
		row("  quarter → end", "RSS %.0f → %.0f MiB, live heap %.0f → %.0f MiB, stacks %.0f → %.0f MiB, goroutines %d → %d (%.1f → %.1f per live node)",
			float64(rs.RSSBytesAtQuarter)/(1<<20), float64(rs.RSSBytesEnd)/(1<<20), float64(rs.HeapBytesAtQuarter)/(1<<20), float64(rs.HeapBytesEnd)/(1<<20),
			float64(rs.StackBytesAtQuarter)/(1<<20), float64(rs.StackBytesEnd)/(1<<20),
			rs.GoroutinesAtQuarter, rs.GoroutinesEnd, rs.GoroutinesPerNodeQuarter, rs.GoroutinesPerNodeEnd)
		if rs.Departed > 0 {
			row("  departed", "%d goroutines still running for %d nodes gone %s or longer", rs.GoroutinesOfDeparted, rs.Departed, DepartedGrace)
		}
	}
	if r.NetNS != nil {
		r.NetNS.printRows(row)
	}
	if o := r.Overload; o != nil {
		row("overload", "flagged %v: timer lag p50 %.1f ms, p95 %.1f ms, p99 %.1f ms; CPU share %.2f; churn lag %.2f s (mean step %.2f s)",
			o.Flagged, o.TimerLagP50Ms, o.TimerLagP95Ms, o.TimerLagP99Ms, o.CPUShare, o.ChurnLagS, o.StepTimeS)
	}
	if c := r.CompareSim; c != nil {
		row("vs simulator", "fidelity mode: sim mean %.1f (min %.0f, max %.0f); real/sim mean %.3f, p5 %.3f, p95 %.3f", c.Sim.Mean, c.Sim.Min, c.Sim.Max, c.Ratio["mean"], c.Ratio["p5"], c.Ratio["p95"])
		row("", "poll mode at the nodes' re-check interval (%.0f ms): sim mean %.1f; real/sim mean %.3f", 1000*c.PollIntervalS, c.Poll.Mean, c.PollRatio["mean"])
	}
	tw.Flush()
	if w := r.OverloadWarning(); w != "" {
		fmt.Fprintln(w0, w)
	}
}

// PrintComparison writes one line per run.
func PrintComparison(w io.Writer, results []*Result) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "barrier\tlive\tmin\tmean\tmax\tp5\tp95\tstalled\twait p50 ms\tcheck p50 ms\taccuracy\tto target s\tsim mean\treal/sim\treal/poll\t")
	for _, r := range results {
		acc, tt, sm, ratio, pratio := "-", "-", "-", "-", "-"
		if a := r.Accuracy; a != nil {
			acc = fmt.Sprintf("%.4f", a.Final)
			if a.TimeToTarget != nil {
				tt = fmt.Sprintf("%.0f", *a.TimeToTarget)
			}
		}
		if c := r.CompareSim; c != nil {
			sm, ratio = fmt.Sprintf("%.1f", c.Sim.Mean), fmt.Sprintf("%.3f", c.Ratio["mean"])
			pratio = fmt.Sprintf("%.3f", c.PollRatio["mean"])
		}
		fmt.Fprintf(tw, "%s\t%d\t%.0f\t%.1f\t%.0f\t%.0f\t%.0f\t%d\t%.1f\t%.2f\t%s\t%s\t%s\t%s\t%s\t\n", r.Barrier, r.LiveNodes,
			r.Steps.Min, r.Steps.Mean, r.Steps.Max, r.Steps.P5, r.Steps.P95, r.StalledNodes, r.BarrierWaitMs.P50, r.BarrierCheckMs.P50, acc, tt, sm, ratio, pratio)
	}
	tw.Flush()
	if len(results) > 0 {
		r := results[0]
		fmt.Fprintf(w, "(%s clock, %d nodes, %.0f s, time scale %g; sim: fidelity mode; poll: poll mode at the nodes' re-check interval)\n", r.Clock, r.Nodes, r.DurationS, r.TimeScale)
	}
	for _, r := range results {
		if n := r.NetNS; n != nil {
			n.printComparisonLine(w, r.Barrier)
		}
		if w2 := r.OverloadWarning(); w2 != "" {
			fmt.Fprintln(w, w2)
		}
	}
}

// reasonList is " (rate 12, distance 3)" for the reasons counted, in name
// order, or "" when there are none.
func reasonList(by map[string]uint64) string {
	if len(by) == 0 {
		return ""
	}
	keys := slices.Sorted(maps.Keys(by))
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, by[k])
	}
	return " (" + strings.Join(parts, ", ") + ")"
}
