package testnet

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"gonum.org/v1/gonum/stat/distuv"

	"github.com/pspnode/pspnode/internal/faults"
	"github.com/pspnode/pspnode/internal/figure"
	"github.com/pspnode/pspnode/internal/procstat"
	"github.com/pspnode/pspnode/psp"
	"github.com/pspnode/pspnode/testnet/sim"
)

// Percentiles are a p50 and a p99.
type Percentiles struct {
	P50 float64 `json:"p50"`
	P99 float64 `json:"p99"`
}

// Result is what a testnet run measured; it is the JSON that
// `pspnode testnet --json` prints.
type Result struct {
	Nodes     int     `json:"nodes"`
	DurationS float64 `json:"duration_s"` // training time, on the run's clock
	Barrier   string  `json:"barrier"`
	Clock     string  `json:"clock"` // virtual or real
	TimeScale float64 `json:"time_scale"`
	Transport string  `json:"transport"`
	Model     string  `json:"model"`
	Exchange  string  `json:"exchange"`
	Seed      uint64  `json:"seed"`
	WarmupS   float64 `json:"warmup_s"`
	// WallS is the wall time training took (0 when the run could not tell)
	// and VirtualPerWall the run's seconds per wall second: on the virtual
	// clock, how much faster (or slower) than real time the machine ran it.
	WallS          float64 `json:"wall_s,omitempty"`
	VirtualPerWall float64 `json:"virtual_per_wall,omitempty"`
	// Overload (real clock only) says whether the machine set the pace.
	Overload *Overload `json:"overload,omitempty"`

	Steps          sim.Stats  `json:"steps"`
	FastSteps      *sim.Stats `json:"fast_steps,omitempty"`      // non-stragglers, when there are stragglers
	StragglerSteps *sim.Stats `json:"straggler_steps,omitempty"` // stragglers
	StalledNodes   int        `json:"stalled_nodes"`
	LiveNodes      int        `json:"live_nodes"`
	Joined         int        `json:"joined"`
	Left           int        `json:"left"`
	Crashed        int        `json:"crashed"`
	// JoinS is how long joins took, from a join's start to the joiner's
	// first step (nil without joins).
	JoinS *Percentiles `json:"join_s,omitempty"`

	Population struct {
		MedianRelError float64 `json:"median_rel_error"`
		P95RelError    float64 `json:"p95_rel_error"`
		// Used is the population the honest nodes use (node.Population:
		// the overlay's estimate checked against the peers' reports, as
		// their learning rate and /status see it), over every record of
		// the training, not only the last.
		Used *UsedPopulation `json:"used,omitempty"`
	} `json:"population"`
	Sampling struct {
		MaxOverMean float64 `json:"max_over_mean"`
		MinOverMean float64 `json:"min_over_mean"`
		Chi2P       float64 `json:"chi2_p"`
		Draws       int     `json:"draws"`
		Peers       int     `json:"peers"`
	} `json:"sampling"`
	BarrierWaitMs Percentiles `json:"barrier_wait_ms"`
	// BarrierChecks counts the honest live nodes' barrier checks, and
	// ChecksPerWaitS divides the re-checks among them (checks that did
	// not follow a step) by the time those nodes spent waiting: how often
	// a waiting node re-checks (the simulator's poll mode, about 20 times
	// a second).
	BarrierChecks  uint64      `json:"barrier_checks"`
	ChecksPerWaitS float64     `json:"checks_per_wait_s"`
	BarrierCheckMs Percentiles `json:"barrier_check_ms"` // one decision: sample, query, decide
	// BarrierExcused counts the sampled peers behind a check's threshold
	// that the honest live nodes' pace rule did not wait for
	// (psp_barrier_peers_excused_total), slow and far behind.
	BarrierExcused struct {
		Slow uint64 `json:"slow"`
		Far  uint64 `json:"far"`
	} `json:"barrier_excused"`
	SampleRTTMs Percentiles `json:"sample_rtt_ms"`
	Updates     struct {
		Sent     uint64 `json:"sent"`
		Received uint64 `json:"received"`
		Rejected uint64 `json:"rejected"`
		// ByReason splits Rejected: models refused once their bytes came.
		ByReason map[string]uint64 `json:"rejected_by_reason,omitempty"`
		// Declined counts the models refused at their offer, before any
		// of their bytes (epidemic exchange), by reason in
		// DeclinedByReason. An honest run declines some for "rate": a
		// sender's model that came sooner than one that samples its peers
		// would come again; the sender offers it to another peer.
		Declined         uint64            `json:"declined"`
		DeclinedByReason map[string]uint64 `json:"declined_by_reason,omitempty"`
		BytesPerUpdate   float64           `json:"bytes_per_update"`
	} `json:"updates"`
	Accuracy *Accuracy `json:"accuracy,omitempty"`
	// Traffic is what the honest live nodes' streams carried in training.
	Traffic *TrafficReport `json:"traffic,omitempty"`
	// Connections: how many each live honest node held at the end (mean
	// and most), how many it opened per minute of training, inbound and
	// outbound (each costs an identify exchange and, for DHT peers, a
	// lookup check), and how many step queries had to dial (the peer was
	// not connected) per barrier check.
	Connections struct {
		HeldMean         float64 `json:"held_mean"`
		HeldMax          int     `json:"held_max"`
		OpenedPerNodeMin float64 `json:"opened_per_node_min"`
		DialsPerCheck    float64 `json:"dials_per_check"`
	} `json:"connections"`

	// Defences sums, over the honest live nodes, what their defences did.
	Defences struct {
		ReportsScreened    uint64 `json:"reports_screened"`
		UpdatesNormRefused uint64 `json:"updates_norm_refused"`
		StreamsRefused     uint64 `json:"streams_refused"`
		// StepQueriesFailed counts the honest live nodes' step queries
		// that failed or timed out (psp_samples_timed_out_total).
		StepQueriesFailed uint64 `json:"step_queries_failed"`
	} `json:"defences"`
	// LogWarnings counts the records at warn level and above every node
	// logged, and their size as text lines.
	LogWarnings struct {
		Lines uint64 `json:"lines"`
		Bytes uint64 `json:"bytes"`
	} `json:"log_warnings"`
	Hostile *Hostility `json:"hostile,omitempty"`
	// Membership is what the honest live nodes' overlays hold at the end
	// (in-process transports only).
	Membership *Membership `json:"membership,omitempty"`

	PeakRSSBytes int64      `json:"peak_rss_bytes"`
	Resources    *Resources `json:"resources,omitempty"` // at a quarter of the run and at its end
	CPUS         float64    `json:"cpu_s"`
	Cost         *Cost      `json:"cost,omitempty"` // the figures above per node and per paper second

	CompareSim *Comparison `json:"compare_sim,omitempty"`
	// NetNS is the netns transport's own figures (a process per node).
	NetNS *NetnsReport `json:"netns,omitempty"`

	steps   []stepRow
	ests    []estRow
	accs    []accRow
	churned []churnRow
	finals  []finalRow
}

// Hostility reports a run with hostile or faulty nodes (Config.Roles).
// Every step, wait and accuracy figure of the Result covers honest nodes
// only.
type Hostility struct {
	Roles       string         `json:"roles"`
	Nodes       map[string]int `json:"nodes"` // initial nodes per role
	HonestNodes int            `json:"honest_nodes"`
	// PoisonApplied counts updates of NaN, huge or wrong-length poisoners
	// that reached an honest node's model (the target is zero);
	// NormPoisonDelivered counts the valid-looking large-norm ones, which
	// are delivered and then refused by the norm bound.
	PoisonApplied       uint64 `json:"poison_applied"`
	NormPoisonDelivered uint64 `json:"norm_poison_delivered"`
	// Target is the node the flooders and slow-model nodes attacked,
	// when there are any.
	Target *FloodTarget `json:"flood_target,omitempty"`
	// FakePeersNamed counts the made-up peers fake-peers nodes named in
	// their DHT replies (see Result.Membership for what honest nodes kept).
	FakePeersNamed int `json:"fake_peers_named,omitempty"`
	// Lineage, Wedge and Drift are present with the lineage-hijack,
	// joiner-wedge and drift-poison roles (attacks.go).
	Lineage *LineageFigures `json:"lineage,omitempty"`
	Wedge   *WedgeFigures   `json:"joiner_wedge,omitempty"`
	Drift   *DriftFigures   `json:"drift_poison,omitempty"`
	// Hogs is present with stream-hog, conn-hog and log-flood nodes.
	Hogs *HogFigures `json:"hogs,omitempty"`
	// LiarQueries counts the estimate-liars' step queries that were
	// answered (see Result.Population.Used for what they did).
	LiarQueries uint64 `json:"estimate_liar_queries,omitempty"`
	// SybilFigures are present with Sybil roles.
	*SybilFigures
}

// FloodTarget compares the flooders' (and slow-model nodes') target with
// the other honest nodes.
type FloodTarget struct {
	Steps           int64   `json:"steps"`
	HonestMeanSteps float64 `json:"honest_mean_steps"`
	StreamsRefused  uint64  `json:"streams_refused"`
	// StepStreamsRefused and ModelStreamsRefused split StreamsRefused:
	// a refused step stream is a peer's step query the target did not
	// answer.
	StepStreamsRefused  uint64 `json:"step_streams_refused"`
	ModelStreamsRefused uint64 `json:"model_streams_refused"`
	// HeldLiveBy counts the other honest live nodes that hold the target
	// as a live member at the end (out of HonestPeers): peers whose
	// queries it refused take it for dead.
	HeldLiveBy  int  `json:"held_live_by"`
	HonestPeers int  `json:"honest_peers"`
	Live        bool `json:"live"`
}

// UsedPopulation summarises the population the honest nodes used, read
// every RecordEvery over the training: |N̂ − N| / N's median and p95 over
// every node and record, the largest N̂ any node used, and the largest
// factor any node's N̂ was off N by, either way (max(N̂/N, N/N̂)).
type UsedPopulation struct {
	MedianRelError float64 `json:"median_rel_error"`
	P95RelError    float64 `json:"p95_rel_error"`
	Max            float64 `json:"max"`
	WorstFactor    float64 `json:"worst_factor"`
}

// Accuracy is how well the trained models do on held-out data: accuracy
// for classifiers, R² (coefficient of determination) for linear
// regression, as Metric says.
type Accuracy struct {
	Metric       string   `json:"metric"`
	Final        float64  `json:"final"`
	FinalLoss    float64  `json:"final_loss"`
	Target       float64  `json:"target"`
	TimeToTarget *float64 `json:"time_to_target_s"` // null if never reached
}

type finalRow struct {
	node   int
	factor float64
	step   int64
	live   bool
}

// result gathers the run's Result from the members and the recorder's
// rows; the nodes must still run.
func (t *testnet) result(elapsed, warm time.Duration) *Result {
	t.mu.Lock()
	defer t.mu.Unlock()
	c := t.cfg
	r := &Result{
		Nodes: c.Nodes, DurationS: elapsed.Seconds(), Barrier: c.Barrier.String(), Clock: string(c.Clock),
		TimeScale: c.TimeScale, Transport: c.Transport, Model: c.Model, Exchange: c.Exchange.String(), Seed: c.Seed, WarmupS: warm.Seconds(),
		StalledNodes: len(t.stalls), steps: t.steps, ests: t.ests, accs: t.accs,
		churned: slices.Clone(t.churned),
	}
	if len(t.joins) > 0 {
		js := slices.Clone(t.joins)
		slices.Sort(js)
		r.JoinS = &Percentiles{P50: sim.Percentile(js, 50), P99: sim.Percentile(js, 99)}
	}
	var all, fast, slow, waits, checks, rtts []float64
	var counts []float64
	var waitS, rechecks float64
	var held, opened, nodeMin, dials float64
	var traffic trafficSum
	if len(c.Roles) > 0 {
		r.Hostile = &Hostility{Roles: FormatRoles(c.Roles), Nodes: map[string]int{},
			PoisonApplied: t.poisonApplied.Load(), NormPoisonDelivered: t.normDelivered.Load(),
			SybilFigures: t.sybilFigures(), FakePeersNamed: t.fakesNamed()}
	}
	for _, m := range t.members {
		live := m.leftAt < 0
		r.finals = append(r.finals, finalRow{m.idx, m.factor, m.step(), live})
		if m.probe {
			continue // Hostility.Wedge
		}
		if m.role != Honest {
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
		r.Defences.StepQueriesFailed += uint64(counterOf(m.nd.Registry(), "psp_samples_timed_out_total", "", ""))
		r.BarrierExcused.Slow += uint64(counterOf(m.nd.Registry(), "psp_barrier_peers_excused_total", "reason", psp.Slow.String()))
		r.BarrierExcused.Far += uint64(counterOf(m.nd.Registry(), "psp_barrier_peers_excused_total", "reason", psp.Far.String()))
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
		if t.target != nil && t.hasRole(Flooder, SlowModel, StreamHog, ConnHog, LogFlood) {
			r.Hostile.Target = t.floodTarget(r.Steps.Mean)
		}
		t.impostorFigures(r.Hostile)
		r.Hostile.Hogs = t.hogFigures()
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
		r.Population.Used = &UsedPopulation{MedianRelError: sim.Percentile(used, 50), P95RelError: sim.Percentile(used, 95), Max: t.usedMax, WorstFactor: t.usedOff}
	}
	r.Sampling.MaxOverMean, r.Sampling.MinOverMean, r.Sampling.Chi2P, r.Sampling.Draws = uniformity(counts)
	r.Sampling.Peers = len(counts)
	ms := func(xs []float64) Percentiles {
		slices.Sort(xs)
		return Percentiles{P50: 1000 * sim.Percentile(xs, 50), P99: 1000 * sim.Percentile(xs, 99)}
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
func (t *testnet) floodTarget(honestMeanSteps float64) *FloodTarget {
	st := t.target.nd.Status()
	tg := &FloodTarget{Steps: t.target.nd.Step(), HonestMeanSteps: honestMeanSteps,
		StreamsRefused: st.StreamsRefused, StepStreamsRefused: st.StreamsRefusedBy["step"],
		ModelStreamsRefused: st.StreamsRefusedBy["model"], Live: t.target.leftAt < 0}
	for _, m := range t.liveLocked() {
		if m == t.target || m.role != Honest {
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
func (t *testnet) accuracy() *Accuracy {
	last := t.accs[len(t.accs)-1]
	a := &Accuracy{Metric: t.metric(), Final: last.accuracy, FinalLoss: last.loss, Target: t.cfg.AccuracyTarget}
	for _, row := range t.accs {
		if row.accuracy >= t.cfg.AccuracyTarget {
			v := row.t
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

// WriteOut writes the run's CSV files, figures and summary.json under dir:
//
//	steps_over_time.csv   time_s,node,step
//	final_steps.csv       node,straggle_factor,final_step,live
//	barrier_waits.csv     wait_ms (recent waits of live nodes)
//	estimate.csv          time_s,true_n,median_rel_error,p5,p95
//	accuracy.csv          time_s,accuracy,loss,updates_sent,in_bytes_per_node
//	churn_events.csv      time_s,event,node (leave, crash, join: as each began)
//	processes.csv         one row per node process (netns transport only)
//	step_distribution.png, estimate.png, accuracy.png, summary.json
func (r *Result) WriteOut(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("output directory: %w", err)
	}
	f := func(v float64) string { return strconv.FormatFloat(v, 'g', 6, 64) }
	var rows [][]string
	for _, s := range r.steps {
		rows = append(rows, []string{f(s.t), strconv.Itoa(s.node), strconv.FormatInt(s.step, 10)})
	}
	if err := figure.CSV(filepath.Join(dir, "steps_over_time.csv"), []string{"time_s", "node", "step"}, rows); err != nil {
		return err
	}
	rows = nil
	var finals []float64
	for _, x := range r.finals {
		rows = append(rows, []string{strconv.Itoa(x.node), f(x.factor), strconv.FormatInt(x.step, 10), strconv.FormatBool(x.live)})
		if x.live {
			finals = append(finals, float64(x.step))
		}
	}
	if err := figure.CSV(filepath.Join(dir, "final_steps.csv"), []string{"node", "straggle_factor", "final_step", "live"}, rows); err != nil {
		return err
	}
	rows = nil
	var ex, ey, elo, ehi []float64
	for _, e := range r.ests {
		rows = append(rows, []string{f(e.t), strconv.Itoa(e.truth), f(e.median), f(e.lo), f(e.hi)})
		ex, ey, elo, ehi = append(ex, e.t), append(ey, 100*e.median), append(elo, 100*e.lo), append(ehi, 100*e.hi)
	}
	if err := figure.CSV(filepath.Join(dir, "estimate.csv"), []string{"time_s", "true_n", "median_rel_error", "p5_rel_error", "p95_rel_error"}, rows); err != nil {
		return err
	}
	rows = nil
	var ax, ay []float64
	for _, a := range r.accs {
		rows = append(rows, []string{f(a.t), f(a.accuracy), f(a.loss), f(a.updates), f(a.inBytes)})
		ax, ay = append(ax, a.t), append(ay, a.accuracy)
	}
	if err := figure.CSV(filepath.Join(dir, "accuracy.csv"), []string{"time_s", "accuracy", "loss", "updates_sent", "in_bytes_per_node"}, rows); err != nil {
		return err
	}
	rows = nil
	for _, c := range r.churned {
		rows = append(rows, []string{f(c.t), string(c.kind), strconv.Itoa(c.node)})
	}
	if err := figure.CSV(filepath.Join(dir, "churn_events.csv"), []string{"time_s", "event", "node"}, rows); err != nil {
		return err
	}
	if r.NetNS != nil {
		if err := r.NetNS.writeCSV(dir); err != nil {
			return err
		}
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "summary.json"), append(b, '\n'), 0o644); err != nil {
		return err
	}
	title := fmt.Sprintf("%s: final steps of %d live nodes (%.0f s)", r.Barrier, r.LiveNodes, r.DurationS)
	if err := figure.Lines(filepath.Join(dir, "step_distribution.png"), figure.Options{Title: title, XLabel: "final step", YLabel: "share of nodes"}, figure.Distribution(r.Barrier, finals)); err != nil {
		return err
	}
	if len(ex) > 0 {
		if err := figure.Lines(filepath.Join(dir, "estimate.png"), figure.Options{Title: "Population estimate error (live nodes)", XLabel: "time (s)", YLabel: "|N̂ − N| / N (%)"},
			figure.Series{Name: "median", X: ex, Y: ey}, figure.Series{Name: "p5", X: ex, Y: elo}, figure.Series{Name: "p95", X: ex, Y: ehi}); err != nil {
			return err
		}
	}
	if len(ax) > 0 {
		if err := figure.Lines(filepath.Join(dir, "accuracy.png"), figure.Options{Title: fmt.Sprintf("%s: held-out accuracy", r.Barrier), XLabel: "time (s)", YLabel: "accuracy"}, figure.Series{Name: r.Barrier, X: ax, Y: ay}); err != nil {
			return err
		}
	}
	return nil
}

// WriteComparison writes figures that set several runs side by side under
// dir: step_distribution.png (final steps of every run), accuracy_time.png,
// accuracy_updates.png and accuracy_bytes.png (held-out accuracy against
// wall time, the number of updates sent, and the bytes a node received),
// and comparison.csv (one row per run).
func WriteComparison(dir string, results []*Result) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("output directory: %w", err)
	}
	var dists, accT, accU, accB []figure.Series
	var rows [][]string
	f := func(v float64) string { return strconv.FormatFloat(v, 'g', 6, 64) }
	metric := "accuracy"
	for _, r := range results {
		var finals []float64
		for _, x := range r.finals {
			if x.live {
				finals = append(finals, float64(x.step))
			}
		}
		dists = append(dists, figure.Distribution(r.Barrier, finals))
		st, su, sb := figure.Series{Name: r.Barrier}, figure.Series{Name: r.Barrier}, figure.Series{Name: r.Barrier}
		for _, a := range r.accs {
			st.X, st.Y = append(st.X, a.t), append(st.Y, a.accuracy)
			su.X, su.Y = append(su.X, a.updates), append(su.Y, a.accuracy)
			sb.X, sb.Y = append(sb.X, a.inBytes/1e6), append(sb.Y, a.accuracy)
		}
		accT, accU, accB = append(accT, st), append(accU, su), append(accB, sb)
		final, tt := "", ""
		if a := r.Accuracy; a != nil {
			metric = a.Metric
			final = f(a.Final)
			if a.TimeToTarget != nil {
				tt = f(*a.TimeToTarget)
			}
		}
		rows = append(rows, []string{r.Barrier, strconv.Itoa(r.LiveNodes), f(r.Steps.Min), f(r.Steps.Mean), f(r.Steps.Max),
			f(r.Steps.P5), f(r.Steps.P95), strconv.Itoa(r.StalledNodes), final, tt, f(r.BarrierWaitMs.P50), f(r.DurationS)})
	}
	if err := figure.CSV(filepath.Join(dir, "comparison.csv"), []string{"barrier", "live_nodes", "steps_min", "steps_mean", "steps_max",
		"steps_p5", "steps_p95", "stalled_nodes", metric + "_final", "time_to_target_s", "barrier_wait_p50_ms", "duration_s"}, rows); err != nil {
		return err
	}
	r0 := results[0]
	if err := figure.Lines(filepath.Join(dir, "step_distribution.png"), figure.Options{
		Title: fmt.Sprintf("Final steps, %d nodes, %.0f s", r0.Nodes, r0.DurationS), XLabel: "final step", YLabel: "share of nodes",
	}, dists...); err != nil {
		return err
	}
	if r0.Model == "none" {
		return nil
	}
	if err := figure.Lines(filepath.Join(dir, "accuracy_time.png"), figure.Options{
		Title: fmt.Sprintf("Held-out %s against wall time (%d nodes, %s)", metric, r0.Nodes, r0.Model), XLabel: "time (s)", YLabel: metric, LegendBottom: true,
	}, accT...); err != nil {
		return err
	}
	if err := figure.Lines(filepath.Join(dir, "accuracy_bytes.png"), figure.Options{
		Title: fmt.Sprintf("Held-out %s against bytes received (%d nodes, %s)", metric, r0.Nodes, r0.Model), XLabel: "MB received per node", YLabel: metric, LegendBottom: true,
	}, accB...); err != nil {
		return err
	}
	return figure.Lines(filepath.Join(dir, "accuracy_updates.png"), figure.Options{
		Title: fmt.Sprintf("Held-out %s against updates sent (%d nodes, %s)", metric, r0.Nodes, r0.Model), XLabel: "updates sent (all nodes)", YLabel: metric, LegendBottom: true,
	}, accU...)
}
