package report

import (
	"fmt"
	"io"
	"path/filepath"
	"strconv"

	"github.com/pspnode/pspnode/internal/figure"
	"github.com/pspnode/pspnode/node/netsetup"
	"github.com/pspnode/pspnode/testnet/sim"
)

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

	// Procs are processes.csv's rows, not in the JSON.
	Procs []ProcRow `json:"-"`
}

// Spread is a mean, a median and a maximum over the nodes.
type Spread struct {
	Mean float64 `json:"mean"`
	P50  float64 `json:"p50"`
	Max  float64 `json:"max"`
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

// Add adds one node's /status nat object.
func (t *TraversalSum) Add(st netsetup.NATStatus) {
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

// ProcRow is one node process's line in processes.csv.
type ProcRow struct {
	Node                  int
	NATed                 bool
	Cores, Factor         float64
	Steps                 int64
	CPUShare, RSSMiB      float64
	QueriesOK, QueriesBad float64
	Live                  bool
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
	for _, p := range n.Procs {
		rows = append(rows, []string{strconv.Itoa(p.Node), strconv.FormatBool(p.NATed), f(p.Cores), f(p.Factor),
			strconv.FormatInt(p.Steps, 10), f(p.CPUShare), f(p.RSSMiB), f(p.QueriesOK), f(p.QueriesBad), strconv.FormatBool(p.Live)})
	}
	return figure.CSV(filepath.Join(dir, "processes.csv"), []string{"node", "nated", "cpu_quota_cores", "straggle_factor", "steps",
		"cpu_share", "rss_mib", "step_queries_ok", "step_queries_failed", "live"}, rows)
}
