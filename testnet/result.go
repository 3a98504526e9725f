package testnet

import (
	"slices"
	"time"

	"gonum.org/v1/gonum/stat/distuv"

	"github.com/pspnode/pspnode/internal/faults"
	"github.com/pspnode/pspnode/internal/procstat"
	"github.com/pspnode/pspnode/node"
	"github.com/pspnode/pspnode/psp"
	"github.com/pspnode/pspnode/testnet/hostile"
	"github.com/pspnode/pspnode/testnet/plan"
	"github.com/pspnode/pspnode/testnet/report"
	"github.com/pspnode/pspnode/testnet/sim"
)

// result gathers the run's Result from the members and the recorder's
// rows; the nodes must still run.
func (t *testnet) result(elapsed, warm time.Duration) *report.Result {
	t.mu.Lock()
	defer t.mu.Unlock()
	c := t.cfg
	r := &report.Result{
		Nodes: c.Nodes, DurationS: elapsed.Seconds(), Barrier: c.Barrier.String(), Clock: string(c.Clock),
		TimeScale: c.TimeScale, Transport: c.Transport, Model: c.Model, Exchange: c.Exchange.String(), Seed: c.Seed, WarmupS: warm.Seconds(),
		StalledNodes: len(t.stalls), Rows: report.Rows{Steps: t.steps, Estimates: t.ests, Accuracy: t.accs, Churn: slices.Clone(t.churned)},
	}
	if len(t.joins) > 0 {
		js := slices.Clone(t.joins)
		slices.Sort(js)
		r.JoinS = &report.Percentiles{P50: sim.Percentile(js, 50), P99: sim.Percentile(js, 99)}
	}
	var all, fast, slow, waits, checks, rtts []float64
	var counts []float64
	var waitS, rechecks float64
	var held, opened, nodeMin, dials float64
	var traffic trafficSum
	if len(c.Roles) > 0 {
		r.Hostile = &report.Hostility{Roles: plan.FormatRoles(c.Roles), Nodes: map[string]int{},
			PoisonApplied: t.poisonApplied.Load(), NormPoisonDelivered: t.normDelivered.Load()}
	}
	for _, m := range t.members {
		live := m.leftAt < 0
		r.Rows.Finals = append(r.Rows.Finals, report.FinalRow{Node: m.idx, Factor: m.factor, Step: m.step(), Live: live})
		if m.probe {
			continue // Hostility.Wedge
		}
		if m.role != plan.Honest {
			if m.joinedAt == 0 {
				r.Hostile.Nodes[string(m.role)]++
			}
			continue // every figure below is of honest nodes
		}
		switch {
		case m.joinedAt > 0:
			r.Joined++
		}
		if !live {
			if m.crashed {
				r.Crashed++
			} else {
				r.Left++
			}
			continue
		}
		traffic.add(m, elapsed-m.joinedAt)
		s := float64(m.nd.Step())
		all = append(all, s)
		if m.factor > 1 {
			slow = append(slow, s)
		} else {
			fast = append(fast, s)
		}
		st := m.nd.Status()
		r.Defences.ReportsScreened += st.ReportsScreened
		r.Defences.UpdatesNormRefused += st.UpdatesNormRefused
		r.Defences.StreamsRefused += st.StreamsRefused
		r.Defences.StepQueriesFailed += uint64(report.CounterOf(m.nd.Registry(), "psp_samples_timed_out_total", "", ""))
		r.BarrierExcused.Slow += uint64(report.CounterOf(m.nd.Registry(), "psp_barrier_peers_excused_total", "reason", psp.Slow.String()))
		r.BarrierExcused.Far += uint64(report.CounterOf(m.nd.Registry(), "psp_barrier_peers_excused_total", "reason", psp.Far.String()))
		held += float64(st.ConnectedPeers)
		r.Connections.HeldMax = max(r.Connections.HeldMax, st.ConnectedPeers)
		dials += float64(st.StepDials)
		if up := (elapsed - m.joinedAt).Minutes(); up > 0 {
			opened += float64(st.ConnectionsOpened - m.opened0)
			nodeMin += up
		}
		r.BarrierChecks += st.BarrierChecks
		rechecks += float64(st.BarrierChecks) - float64(st.BarrierPasses)
		waitS += st.BarrierWaitS
		w, ck, rt := faults.Recent(m.nd)
		waits, checks, rtts = append(waits, w...), append(checks, ck...), append(rtts, rt...)
		if m.joinedAt == 0 { // present all run: its selection count is comparable
			t.sampledMu.Lock()
			counts = append(counts, float64(t.sampled[m.nd.ID()]))
			t.sampledMu.Unlock()
		}
		if m.nd.Model().NumParams() > 0 {
			st := m.nd.UpdateStats()
			r.Updates.Sent += st.Sent
			r.Updates.Received += st.Received
			r.Updates.Rejected += st.TotalRejected()
			for k, c := range st.Rejected {
				if c > 0 {
					if r.Updates.ByReason == nil {
						r.Updates.ByReason = map[string]uint64{}
					}
					r.Updates.ByReason[string(k)] += c
				}
			}
			for k, c := range st.Declined {
				if c > 0 {
					if r.Updates.DeclinedByReason == nil {
						r.Updates.DeclinedByReason = map[string]uint64{}
					}
					r.Updates.DeclinedByReason[string(k)] += c
					r.Updates.Declined += c
				}
			}
			if st.Sent > 0 {
				r.Updates.BytesPerUpdate = st.MeanSentBytes()
			}
		}
	}
	r.LiveNodes = len(all)
	r.LogWarnings.Lines, r.LogWarnings.Bytes = t.warnLines.Load(), t.warnBytes.Load()
	r.Traffic = traffic.report()
	if len(all) > 0 {
		r.Connections.HeldMean = held / float64(len(all))
	}
	if nodeMin > 0 {
		r.Connections.OpenedPerNodeMin = opened / nodeMin
	}
	if r.BarrierChecks > 0 {
		r.Connections.DialsPerCheck = dials / float64(r.BarrierChecks)
	}
	r.Steps = sim.Summarize(all)
	if r.Hostile != nil {
		r.Hostile.HonestNodes = len(all)
		if t.target != nil && c.HasRole(plan.Flooder, plan.SlowModel, plan.StreamHog, plan.ConnHog, plan.LogFlood) {
			r.Hostile.Target = t.floodTarget(r.Steps.Mean)
		}
		var honest []*node.Node
		var probes []hostile.Probe
		for _, m := range t.members {
			switch {
			case m.probe && m.nd != nil:
				probes = append(probes, hostile.Probe{Node: m.nd, Live: m.leftAt < 0})
			case m.role == plan.Honest && !m.probe && m.leftAt < 0:
				honest = append(honest, m.nd)
			}
		}
		t.play.Figures(r.Hostile, honest, probes)
	}
	if len(slow) > 0 && len(fast) > 0 {
		f, s := sim.Summarize(fast), sim.Summarize(slow)
		r.FastSteps, r.StragglerSteps = &f, &s
	}
	rel := slices.Clone(t.relErr)
	slices.Sort(rel)
	r.Population.MedianRelError, r.Population.P95RelError = sim.Percentile(rel, 50), sim.Percentile(rel, 95)
	if len(t.usedErr) > 0 {
		used := slices.Clone(t.usedErr)
		slices.Sort(used)
		r.Population.Used = &report.UsedPopulation{MedianRelError: sim.Percentile(used, 50), P95RelError: sim.Percentile(used, 95), Max: t.usedMax, WorstFactor: t.usedOff}
	}
	r.Sampling.MaxOverMean, r.Sampling.MinOverMean, r.Sampling.Chi2P, r.Sampling.Draws = uniformity(counts)
	r.Sampling.Peers = len(counts)
	ms := func(xs []float64) report.Percentiles {
		slices.Sort(xs)
		return report.Percentiles{P50: 1000 * sim.Percentile(xs, 50), P99: 1000 * sim.Percentile(xs, 99)}
	}
	r.BarrierWaitMs, r.BarrierCheckMs, r.SampleRTTMs = ms(waits), ms(checks), ms(rtts)
	if waitS > 0 {
		r.ChecksPerWaitS = rechecks / waitS
	}
	if c.Model != "none" && len(t.accs) > 0 {
		r.Accuracy = t.accuracy()
	}
	r.PeakRSSBytes = procstat.PeakRSS()
	r.CPUS = (procstat.CPUTime() - t.cpu0).Seconds()
	return r
}

// floodTarget reports how the flooders' target fared beside the honest
// nodes' mean steps; t.mu is held.
func (t *testnet) floodTarget(honestMeanSteps float64) *report.FloodTarget {
	st := t.target.nd.Status()
	tg := &report.FloodTarget{Steps: t.target.nd.Step(), HonestMeanSteps: honestMeanSteps,
		StreamsRefused: st.StreamsRefused, StepStreamsRefused: st.StreamsRefusedBy["step"],
		ModelStreamsRefused: st.StreamsRefusedBy["model"], Live: t.target.leftAt < 0}
	for _, m := range t.liveLocked() {
		if m == t.target || m.role != plan.Honest {
			continue
		}
		tg.HonestPeers++
		if slices.Contains(m.nd.Overlay().Peers(), t.target.nd.ID()) {
			tg.HeldLiveBy++
		}
	}
	return tg
}

// accuracy is the last evaluation and the first time it reached the
// target; there must have been one. t.mu is held.
func (t *testnet) accuracy() *report.Accuracy {
	last := t.accs[len(t.accs)-1]
	a := &report.Accuracy{Metric: t.metric(), Final: last.Accuracy, FinalLoss: last.Loss, Target: t.cfg.AccuracyTarget}
	for _, row := range t.accs {
		if row.Accuracy >= t.cfg.AccuracyTarget {
			v := row.T
			a.TimeToTarget = &v
			break
		}
	}
	return a
}

// uniformity compares selection counts with a uniform expectation.
func uniformity(counts []float64) (maxMean, minMean, p float64, draws int) {
	if len(counts) < 2 {
		return 0, 0, 0, 0
	}
	var total float64
	for _, c := range counts {
		total += c
	}
	if total == 0 {
		return 0, 0, 0, 0
	}
	mean := total / float64(len(counts))
	var chi2 float64
	for _, c := range counts {
		chi2 += (c - mean) * (c - mean) / mean
	}
	p = distuv.ChiSquared{K: float64(len(counts) - 1)}.Survival(chi2)
	return slices.Max(counts) / mean, slices.Min(counts) / mean, p, int(total)
}
