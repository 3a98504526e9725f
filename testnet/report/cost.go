package report

// Cost is what a run cost this machine, in the units that decide which
// experiments fit on it: CPU per simulated node-second, memory and
// connections per node.
//
// Paper seconds are training time on the run's clock divided by the time
// scale: the paper's steps take (Exp(1)+1) s, and --time-scale 0.05 runs
// them 20 times faster, so 10 s of training there is 200 paper seconds. A
// node-second is one node for one such second. PaperNodeSPerCPUS is the
// run's nodes × paper seconds over the run's CPU seconds (the process's
// from the start of Run: set-up, warm-up and the report included, runs
// before it in the process not), so a cheaper run has a larger figure.
// The peak RSS is the run's too, from the memory the process held when it
// began (after returning what it could to the system).
type Cost struct {
	CPUS                     float64 `json:"cpu_s"`
	PaperNodeSPerCPUS        float64 `json:"paper_node_s_per_cpu_s"`
	RSSBytesPerNode          float64 `json:"rss_bytes_per_node"`              // peak RSS over the run's nodes
	ConnectionsHeldPerNode   float64 `json:"connections_held_per_node"`       // at the end, mean over live nodes
	ConnectionsOpenedPerNode float64 `json:"connections_opened_per_node_min"` // over training, per minute of the run's clock
}

// FillCost fills r.Cost from the figures already in r; call it last.
func (r *Result) FillCost() {
	c := &Cost{
		CPUS:                     r.CPUS,
		ConnectionsHeldPerNode:   r.Connections.HeldMean,
		ConnectionsOpenedPerNode: r.Connections.OpenedPerNodeMin,
	}
	if r.Nodes > 0 {
		c.RSSBytesPerNode = float64(r.PeakRSSBytes) / float64(r.Nodes)
	}
	if r.TimeScale > 0 && r.CPUS > 0 {
		c.PaperNodeSPerCPUS = float64(r.Nodes) * r.DurationS / r.TimeScale / r.CPUS
	}
	r.Cost = c
}
