package netns

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"runtime"
	"slices"
	"time"

	"github.com/pspnode/pspnode/internal/procstat"
	"github.com/pspnode/pspnode/testnet/report"
	"github.com/pspnode/pspnode/testnet/sim"
)

func httpRequest(ctx context.Context, url string) (*http.Request, error) {
	return http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
}

func spread(xs []float64) report.Spread {
	xs = slices.DeleteFunc(slices.Clone(xs), func(x float64) bool { return math.IsNaN(x) })
	if len(xs) == 0 {
		return report.Spread{}
	}
	s := sim.Summarize(xs)
	return report.Spread{Mean: s.Mean, P50: s.P50, Max: s.Max}
}

// result builds the Result from the readings at training's start and end.
func (r *netnsRun) result(k *netnsTrack, base, final []reading, elapsed, warm time.Duration, load0 float64) *report.Result {
	c := r.cfg
	res := &report.Result{
		Nodes: c.Nodes, DurationS: elapsed.Seconds(), Barrier: c.Barrier.String(), Clock: string(c.Clock),
		TimeScale: c.TimeScale, Transport: c.Transport, Model: c.Model, Exchange: c.Exchange.String(), Seed: c.Seed, WarmupS: warm.Seconds(),
		StalledNodes: len(k.stalled), Rows: report.Rows{Steps: k.steps, Estimates: k.ests, Accuracy: k.accs}, WallS: elapsed.Seconds(),
	}
	rep := &report.NetnsReport{RunID: r.net.ID, Subnet: r.net.Subnet().String(), LoadAvg1Start: load0, LoadAvg1End: loadAvg1(), Cores: runtime.NumCPU(), BandwidthBytesPerS: c.Bandwidth}
	if math.IsNaN(rep.LoadAvg1Start) || math.IsNaN(rep.LoadAvg1End) {
		rep.LoadAvg1Start, rep.LoadAvg1End = -1, -1 // unknown: JSON has no NaN
	}
	var all, fast, slow, cpu, rss []float64
	var nodesCPU float64 // the node processes' CPU seconds, for Cost
	var checkH, waitH, rttH histogram
	var waitS, rechecks, held, opened float64
	groups := map[string]*groupAcc{"quota": {}, "nat": {}}
	for i, p := range r.procs {
		b, f := base[i], final[i]
		row := report.ProcRow{Node: i, NATed: p.host.NATed, Cores: p.cores, Factor: p.factor, Live: f.ok, CPUShare: math.NaN(), RSSMiB: math.NaN()}
		res.Rows.Finals = append(res.Rows.Finals, report.FinalRow{Node: i, Factor: p.factor, Step: f.st.Step - k.base[i], Live: f.ok})
		if !f.ok {
			rep.Procs = append(rep.Procs, row)
			continue
		}
		s := float64(f.st.Step - k.base[i])
		row.Steps = f.st.Step - k.base[i]
		all = append(all, s)
		if p.factor > 1 || p.cores > 0 {
			slow = append(slow, s)
		} else {
			fast = append(fast, s)
		}
		res.Defences.ReportsScreened += f.st.ReportsScreened
		res.Defences.UpdatesNormRefused += f.st.UpdatesNormRefused
		res.Defences.StreamsRefused += f.st.StreamsRefused
		held += float64(f.st.ConnectedPeers)
		opened += float64(f.st.ConnectionsOpened - min(f.st.ConnectionsOpened, b.st.ConnectionsOpened))
		checks := float64(f.st.BarrierChecks) - float64(b.st.BarrierChecks)
		res.BarrierChecks += uint64(max(0, checks))
		rechecks += checks - (float64(f.st.BarrierPasses) - float64(b.st.BarrierPasses))
		waitS += f.st.BarrierWaitS - b.st.BarrierWaitS
		res.Updates.Sent += f.st.UpdatesSent - min(f.st.UpdatesSent, b.st.UpdatesSent)
		res.Updates.Received += f.st.UpdatesReceived - min(f.st.UpdatesReceived, b.st.UpdatesReceived)
		res.Updates.Rejected += f.st.UpdatesRejected - min(f.st.UpdatesRejected, b.st.UpdatesRejected)
		for _, h := range []struct {
			acc  *histogram
			name string
		}{{&checkH, "psp_barrier_check_seconds"}, {&waitH, "psp_barrier_wait_seconds"}, {&rttH, "psp_sample_rtt_seconds"}} {
			h.acc.add(f.met.hist(h.name), 1)
			if b.ok {
				h.acc.add(b.met.hist(h.name), -1)
			}
		}
		nodesCPU += f.met.values["process_cpu_seconds_total"]
		if c0, ok0 := b.met.values["process_cpu_seconds_total"]; ok0 && b.ok {
			if c1, ok1 := f.met.values["process_cpu_seconds_total"]; ok1 {
				row.CPUShare = (c1 - c0) / elapsed.Seconds()
				cpu = append(cpu, row.CPUShare)
			}
		}
		if v, ok := f.met.values["process_resident_memory_bytes"]; ok {
			row.RSSMiB = v / (1 << 20)
			rss = append(rss, row.RSSMiB)
		}
		row.QueriesOK = f.met.values["psp_sample_rtt_seconds_count"] - b.met.values["psp_sample_rtt_seconds_count"]
		row.QueriesBad = f.met.values["psp_samples_timed_out_total"] - b.met.values["psp_samples_timed_out_total"]
		rep.Procs = append(rep.Procs, row)
		groups["quota"].add(p.cores > 0, row, f)
		groups["nat"].add(p.host.NATed, row, f)
	}
	res.LiveNodes = len(all)
	res.Steps = sim.Summarize(all)
	if len(slow) > 0 && len(fast) > 0 {
		fs, ss := sim.Summarize(fast), sim.Summarize(slow)
		res.FastSteps, res.StragglerSteps = &fs, &ss
	}
	if len(all) > 0 {
		res.Connections.HeldMean = held / float64(len(all))
		res.Connections.OpenedPerNodeMin = opened / float64(len(all)) / elapsed.Minutes()
	}
	rel := slices.Clone(k.relErr)
	slices.Sort(rel)
	res.Population.MedianRelError, res.Population.P95RelError = sim.Percentile(rel, 50), sim.Percentile(rel, 95)
	ms := func(h histogram) report.Percentiles { // 0 when empty: JSON has no NaN
		q := func(x float64) float64 {
			if v := h.quantile(x); !math.IsNaN(v) {
				return 1000 * v
			}
			return 0
		}
		return report.Percentiles{P50: q(0.5), P99: q(0.99)}
	}
	res.BarrierCheckMs, res.BarrierWaitMs, res.SampleRTTMs = ms(checkH), ms(waitH), ms(rttH)
	if waitS > 0 {
		res.ChecksPerWaitS = rechecks / waitS
	}
	if c.Model != "none" && len(k.accs) > 0 {
		last := k.accs[len(k.accs)-1]
		a := &report.Accuracy{Metric: "accuracy", Final: last.Accuracy, FinalLoss: last.Loss, Target: c.AccuracyTarget}
		for _, row := range k.accs {
			if row.Accuracy >= c.AccuracyTarget {
				v := row.T
				a.TimeToTarget = &v
				break
			}
		}
		res.Accuracy = a
	}
	rep.CPUShare, rep.RSSMiB = spread(cpu), spread(rss)
	if c.CPUQuota.Fraction > 0 {
		rep.Quota = groups["quota"].group(fmt.Sprintf("%g cores each", c.CPUQuota.Cores), elapsed)
	}
	if c.NAT > 0 {
		rep.NAT = groups["nat"].group("behind NAT", elapsed)
	}
	res.NetNS = rep
	res.PeakRSSBytes = procstat.PeakRSS()
	res.CPUS = procstat.CPUTime().Seconds()
	// Each node is a process of its own here: the run's cost is theirs
	// and this one's, and a node's memory is its own process's.
	nodeRes := *res
	nodeRes.CPUS += nodesCPU
	nodeRes.FillCost()
	res.Cost = nodeRes.Cost
	if len(rss) > 0 {
		res.Cost.RSSBytesPerNode = (1 << 20) * spread(rss).Mean
	}
	return res
}

// groupAcc gathers a Group.
type groupAcc struct {
	in, out   []float64
	ok, bad   float64
	oOK, oBad float64
	querying  int
	conns     float64
	nat       []report.NodeNAT
}

func (g *groupAcc) add(member bool, row report.ProcRow, f reading) {
	if !member {
		g.out = append(g.out, float64(row.Steps))
		g.oOK, g.oBad = g.oOK+row.QueriesOK, g.oBad+row.QueriesBad
		return
	}
	g.in = append(g.in, float64(row.Steps))
	g.ok, g.bad = g.ok+row.QueriesOK, g.bad+row.QueriesBad
	if row.QueriesOK > 0 {
		g.querying++
	}
	g.conns += float64(f.st.ConnectedPeers)
	if f.st.NAT.Traversal {
		g.nat = append(g.nat, report.NodeNAT{Node: row.Node, NAT: f.st.NAT})
	}
}

func (g *groupAcc) group(what string, elapsed time.Duration) *report.Group {
	gr := &report.Group{What: what, Nodes: len(g.in), Steps: sim.Summarize(g.in), Others: sim.Summarize(g.out),
		QueriesOK: g.ok, QueriesFailed: g.bad, Querying: g.querying, OthersQueriesOK: g.oOK, OthersQueriesFailed: g.oBad,
		NAT: g.nat}
	for _, n := range g.nat {
		if gr.Traversal == nil {
			gr.Traversal = &report.TraversalSum{Reachability: map[string]int{}, HolePunches: map[string]uint64{}}
		}
		gr.Traversal.Add(n.NAT)
	}
	if s := elapsed.Seconds(); s > 0 {
		gr.StepsPerS, gr.OthersStepsPerS = gr.Steps.Mean/s, gr.Others.Mean/s
	}
	if len(g.in) > 0 {
		gr.ConnectedPeers = g.conns / float64(len(g.in))
	}
	return gr
}
