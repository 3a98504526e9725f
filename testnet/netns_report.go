package testnet

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"time"

	"github.com/pspnode/pspnode/internal/figure"
	"github.com/pspnode/pspnode/internal/procstat"
	"github.com/pspnode/pspnode/node/netsetup"
	"github.com/pspnode/pspnode/testnet/sim"
)

func httpRequest(ctx context.Context, url string) (*http.Request, error) {
	return http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
}

// NetnsReport is what a netns testnet measures beyond the common Result:
// the machine's load, what each node process cost, and how the CPU-limited
// and NATed nodes fared against the others.
type NetnsReport struct {
	// RunID names everything the run made (namespaces pspnode-RUNID-…,
	// links pRUNID…); Subnet is its bridge's.
	RunID  string `json:"run_id"`
	Subnet string `json:"subnet"`
	// LoadAvg1Start and LoadAvg1End are the machine's one-minute load
	// averages when training started and ended: the figures are of a real
	// clock on a machine others may share.
	LoadAvg1Start float64 `json:"loadavg1_start"`
	LoadAvg1End   float64 `json:"loadavg1_end"`
	Cores         int     `json:"cores"`
	// CPUShare is each node process's CPU time in training over the
	// training time (1 = one core), and RSSMiB its resident memory at
	// the end, both from the process_* metrics of its /metrics.
	CPUShare Spread `json:"cpu_share"`
	RSSMiB   Spread `json:"rss_mib"`
	// BandwidthBytesPerS is each node's tc tbf rate each way (0: none).
	BandwidthBytesPerS float64 `json:"bandwidth_bytes_per_s,omitempty"`
	// Quota compares the nodes with a CPU quota with the others.
	Quota *Group `json:"cpu_quota,omitempty"`
	// NAT compares the nodes behind NAT routers with the others.
	NAT *Group `json:"nat,omitempty"`

	rows []procRow
}

// Spread is a mean, a median and a maximum over the nodes.
type Spread struct {
	Mean float64 `json:"mean"`
	P50  float64 `json:"p50"`
	Max  float64 `json:"max"`
}

func spread(xs []float64) Spread {
	xs = slices.DeleteFunc(slices.Clone(xs), func(x float64) bool { return math.IsNaN(x) })
	if len(xs) == 0 {
		return Spread{}
	}
	s := sim.Summarize(xs)
	return Spread{Mean: s.Mean, P50: s.P50, Max: s.Max}
}

// Group is a set of nodes (CPU-limited, or NATed) against the rest.
type Group struct {
	What  string `json:"what"` // "0.1 cores each", "behind NAT"
	Nodes int    `json:"nodes"`
	// Steps are the group's steps in training, Others the other nodes'.
	Steps  sim.Stats `json:"steps"`
	Others sim.Stats `json:"others"`
	// StepsPerS are the mean steps per second of training.
	StepsPerS       float64 `json:"steps_per_s"`
	OthersStepsPerS float64 `json:"others_steps_per_s"`
	// QueriesOK counts the group's step queries that were answered in
	// training (psp_sample_rtt_seconds_count), QueriesFailed those that
	// timed out or failed (psp_samples_timed_out_total); Querying is how
	// many of the group's nodes had any answered.
	QueriesOK           float64 `json:"step_queries_ok"`
	QueriesFailed       float64 `json:"step_queries_failed"`
	Querying            int     `json:"nodes_with_answered_queries"`
	OthersQueriesOK     float64 `json:"others_step_queries_ok"`
	OthersQueriesFailed float64 `json:"others_step_queries_failed"`
	ConnectedPeers      float64 `json:"connected_peers_mean"`
	// NAT holds each node's /status nat object at the end (NAT group
	// only), and Traversal sums them: how the nodes found themselves
	// reachable, their connections by kind and their hole punches by
	// result.
	NAT       []NodeNAT     `json:"nat_status,omitempty"`
	Traversal *TraversalSum `json:"traversal,omitempty"`
}

// NodeNAT is one node's NAT traversal state.
type NodeNAT struct {
	Node int                `json:"node"`
	NAT  netsetup.NATStatus `json:"nat"`
}

// TraversalSum adds up the NAT traversal fields of a group's /status.
type TraversalSum struct {
	Reachability map[string]int     `json:"reachability"` // nodes per state
	WithRelay    int                `json:"nodes_with_relay_addrs"`
	Connections  netsetup.ConnKinds `json:"connections"`
	HolePunches  map[string]uint64  `json:"hole_punches"`
}

// add adds one node's /status nat object.
func (t *TraversalSum) add(st netsetup.NATStatus) {
	t.Reachability[st.Reachability]++
	if len(st.RelayAddrs) > 0 {
		t.WithRelay++
	}
	t.Connections.Direct += st.Connections.Direct
	t.Connections.Relayed += st.Connections.Relayed
	t.Connections.HolePunched += st.Connections.HolePunched
	for k, v := range st.HolePunches {
		t.HolePunches[k] += v
	}
}

// procRow is one node process's line in processes.csv.
type procRow struct {
	node                  int
	nated                 bool
	cores, factor         float64
	steps                 int64
	cpuShare, rss         float64
	queriesOK, queriesBad float64
	live                  bool
}

// result builds the Result from the readings at training's start and end.
func (r *netnsRun) result(k *netnsTrack, base, final []reading, elapsed, warm time.Duration, load0 float64) *Result {
	c := r.cfg
	res := &Result{
		Nodes: c.Nodes, DurationS: elapsed.Seconds(), Barrier: c.Barrier.String(), Clock: string(c.Clock),
		TimeScale: c.TimeScale, Transport: c.Transport, Model: c.Model, Exchange: c.Exchange.String(), Seed: c.Seed, WarmupS: warm.Seconds(),
		StalledNodes: len(k.stalled), steps: k.steps, ests: k.ests, accs: k.accs, WallS: elapsed.Seconds(),
	}
	rep := &NetnsReport{RunID: r.net.ID, Subnet: r.net.Subnet().String(), LoadAvg1Start: load0, LoadAvg1End: loadAvg1(), Cores: runtime.NumCPU(), BandwidthBytesPerS: c.Bandwidth}
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
		row := procRow{node: i, nated: p.host.NATed, cores: p.cores, factor: p.factor, live: f.ok, cpuShare: math.NaN(), rss: math.NaN()}
		res.finals = append(res.finals, finalRow{i, p.factor, f.st.Step - k.base[i], f.ok})
		if !f.ok {
			rep.rows = append(rep.rows, row)
			continue
		}
		s := float64(f.st.Step - k.base[i])
		row.steps = f.st.Step - k.base[i]
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
				row.cpuShare = (c1 - c0) / elapsed.Seconds()
				cpu = append(cpu, row.cpuShare)
			}
		}
		if v, ok := f.met.values["process_resident_memory_bytes"]; ok {
			row.rss = v / (1 << 20)
			rss = append(rss, row.rss)
		}
		row.queriesOK = f.met.values["psp_sample_rtt_seconds_count"] - b.met.values["psp_sample_rtt_seconds_count"]
		row.queriesBad = f.met.values["psp_samples_timed_out_total"] - b.met.values["psp_samples_timed_out_total"]
		rep.rows = append(rep.rows, row)
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
	ms := func(h histogram) Percentiles { // 0 when empty: JSON has no NaN
		q := func(x float64) float64 {
			if v := h.quantile(x); !math.IsNaN(v) {
				return 1000 * v
			}
			return 0
		}
		return Percentiles{P50: q(0.5), P99: q(0.99)}
	}
	res.BarrierCheckMs, res.BarrierWaitMs, res.SampleRTTMs = ms(checkH), ms(waitH), ms(rttH)
	if waitS > 0 {
		res.ChecksPerWaitS = rechecks / waitS
	}
	if c.Model != "none" && len(k.accs) > 0 {
		last := k.accs[len(k.accs)-1]
		a := &Accuracy{Metric: "accuracy", Final: last.accuracy, FinalLoss: last.loss, Target: c.AccuracyTarget}
		for _, row := range k.accs {
			if row.accuracy >= c.AccuracyTarget {
				v := row.t
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
	nodeRes.cost()
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
	nat       []NodeNAT
}

func (g *groupAcc) add(member bool, row procRow, f reading) {
	if !member {
		g.out = append(g.out, float64(row.steps))
		g.oOK, g.oBad = g.oOK+row.queriesOK, g.oBad+row.queriesBad
		return
	}
	g.in = append(g.in, float64(row.steps))
	g.ok, g.bad = g.ok+row.queriesOK, g.bad+row.queriesBad
	if row.queriesOK > 0 {
		g.querying++
	}
	g.conns += float64(f.st.ConnectedPeers)
	if f.st.NAT.Traversal {
		g.nat = append(g.nat, NodeNAT{Node: row.node, NAT: f.st.NAT})
	}
}

func (g *groupAcc) group(what string, elapsed time.Duration) *Group {
	gr := &Group{What: what, Nodes: len(g.in), Steps: sim.Summarize(g.in), Others: sim.Summarize(g.out),
		QueriesOK: g.ok, QueriesFailed: g.bad, Querying: g.querying, OthersQueriesOK: g.oOK, OthersQueriesFailed: g.oBad,
		NAT: g.nat}
	for _, n := range g.nat {
		if gr.Traversal == nil {
			gr.Traversal = &TraversalSum{Reachability: map[string]int{}, HolePunches: map[string]uint64{}}
		}
		gr.Traversal.add(n.NAT)
	}
	if s := elapsed.Seconds(); s > 0 {
		gr.StepsPerS, gr.OthersStepsPerS = gr.Steps.Mean/s, gr.Others.Mean/s
	}
	if len(g.in) > 0 {
		gr.ConnectedPeers = g.conns / float64(len(g.in))
	}
	return gr
}

// printRows adds the netns lines to a summary.
func (n *NetnsReport) printRows(row func(k, format string, a ...any)) {
	row("netns run", "%s on %s", n.RunID, n.Subnet)
	row("machine", "load average %.2f at the start, %.2f at the end, %d cores", n.LoadAvg1Start, n.LoadAvg1End, n.Cores)
	row("per node process", "CPU %.1f %% of a core (p50 %.1f %%, max %.1f %%); RSS %.0f MiB (max %.0f MiB)",
		100*n.CPUShare.Mean, 100*n.CPUShare.P50, 100*n.CPUShare.Max, n.RSSMiB.Mean, n.RSSMiB.Max)
	for _, g := range []*Group{n.Quota, n.NAT} {
		if g == nil {
			continue
		}
		row("  "+g.What, "%d nodes: %.2f steps/s (mean %.1f) against %.2f (mean %.1f) for the others", g.Nodes, g.StepsPerS, g.Steps.Mean, g.OthersStepsPerS, g.Others.Mean)
		row("", "step queries answered %.0f, failed %.0f (%d of %d nodes had answers); others %.0f, failed %.0f",
			g.QueriesOK, g.QueriesFailed, g.Querying, g.Nodes, g.OthersQueriesOK, g.OthersQueriesFailed)
		if t := g.Traversal; t != nil {
			row("", "reachability %v; %d with relay addresses; connections %d direct, %d hole-punched, %d relayed; hole punches %v",
				t.Reachability, t.WithRelay, t.Connections.Direct, t.Connections.HolePunched, t.Connections.Relayed, t.HolePunches)
		}
	}
}

// printComparisonLine is a netns run's line under a comparison table.
func (n *NetnsReport) printComparisonLine(w io.Writer, barrier string) {
	line := fmt.Sprintf("%s: load %.1f→%.1f, node CPU %.1f %%, RSS %.0f MiB", barrier, n.LoadAvg1Start, n.LoadAvg1End, 100*n.CPUShare.Mean, n.RSSMiB.Mean)
	for _, g := range []*Group{n.Quota, n.NAT} {
		if g != nil {
			line += fmt.Sprintf("; %s: %.2f steps/s, others %.2f", g.What, g.StepsPerS, g.OthersStepsPerS)
		}
	}
	fmt.Fprintln(w, line)
}

// writeCSV writes processes.csv: node, nated, cpu_quota_cores,
// straggle_factor, steps, cpu_share, rss_mib, step_queries_ok,
// step_queries_failed, live.
func (n *NetnsReport) writeCSV(dir string) error {
	f := func(v float64) string { return strconv.FormatFloat(v, 'g', 6, 64) }
	var rows [][]string
	for _, p := range n.rows {
		rows = append(rows, []string{strconv.Itoa(p.node), strconv.FormatBool(p.nated), f(p.cores), f(p.factor),
			strconv.FormatInt(p.steps, 10), f(p.cpuShare), f(p.rss), f(p.queriesOK), f(p.queriesBad), strconv.FormatBool(p.live)})
	}
	return figure.CSV(filepath.Join(dir, "processes.csv"), []string{"node", "nated", "cpu_quota_cores", "straggle_factor", "steps",
		"cpu_share", "rss_mib", "step_queries_ok", "step_queries_failed", "live"}, rows)
}
