package report

import "fmt"

// LineageFigures is what a run with lineage-hijack nodes measured: the
// lineage the honest live nodes are on at the end.
type LineageFigures struct {
	// OnJob, Hijacked and Other count honest live nodes on the testnet's
	// lineage, on the hijackers', and on another (or none).
	OnJob    int `json:"honest_on_job_lineage"`
	Hijacked int `json:"honest_on_hijack_lineage"`
	Other    int `json:"honest_on_other_lineage"`
	// ForksJoined sums the honest live nodes' psp_forks_joined_total,
	// Resets their psp_resets_total (every reason) and ResetsRefused
	// their psp_resets_refused_total.
	ForksJoined   uint64 `json:"forks_joined"`
	Resets        uint64 `json:"resets"`
	ResetsRefused uint64 `json:"resets_refused"`
	// QueriesSent, RepliesSent and ModelsServed count what the hijackers
	// said: step queries answered, step replies and models sent.
	QueriesSent  uint64 `json:"queries_sent"`
	RepliesSent  uint64 `json:"replies_sent"`
	ModelsServed uint64 `json:"models_served"`
}

// WedgeFigures is what a run with joiner-wedge nodes measured: the
// joiners started through them.
type WedgeFigures struct {
	Joiners int `json:"joiners"`
	// Wedged counts joiners that took the wedge's step (or one past it):
	// no peer of the job is within any staleness bound of them, so they
	// pass their barrier only when a sample holds no honest peer (in a
	// job of 100, 48 passes in 39 428 checks).
	Wedged       int           `json:"wedged"`
	RepliesSent  uint64        `json:"replies_sent"`
	ModelsServed uint64        `json:"models_served"`
	Probes       []WedgeJoiner `json:"probes"`
}

// WedgeJoiner is one joiner through a joiner-wedge node, at the end.
type WedgeJoiner struct {
	Step          int64    `json:"step"`
	BarrierChecks uint64   `json:"barrier_checks"`
	BarrierPasses uint64   `json:"barrier_passes"`
	Live          bool     `json:"live"`
	Loss          *float64 `json:"loss,omitempty"` // of its model on the held-out data
}

// DriftFigures counts the drift-poison nodes' pushes and how the honest
// nodes answered them.
type DriftFigures struct {
	Pushes        uint64 `json:"pushes"`
	Taken         uint64 `json:"taken"`
	Distance      uint64 `json:"refused_distance"`
	Rate          uint64 `json:"refused_rate"`
	Other         uint64 `json:"refused_other_or_failed"`
	ModelsFetched uint64 `json:"victim_models_fetched"`
}

// printImpostors writes the impostor roles' summary rows.
func (h *Hostility) printImpostors(row func(k, format string, a ...any)) {
	if l := h.Lineage; l != nil {
		row("  lineage hijack", "honest live nodes on the job's lineage %d, on the hijackers' %d, other %d (%d forks joined, %d resets, %d refused for their rate); hijackers sent %d queries, %d replies, %d models",
			l.OnJob, l.Hijacked, l.Other, l.ForksJoined, l.Resets, l.ResetsRefused, l.QueriesSent, l.RepliesSent, l.ModelsServed)
	}
	if w := h.Wedge; w != nil {
		row("  joiner wedge", "%d of %d joiners through a wedge node took its step; wedge nodes sent %d step replies, %d models",
			w.Wedged, w.Joiners, w.RepliesSent, w.ModelsServed)
		for i, j := range w.Probes {
			loss := "n/a"
			if j.Loss != nil {
				loss = fmt.Sprintf("%.4g", *j.Loss)
			}
			row(fmt.Sprintf("    joiner %d", i), "step %d, %d barrier checks, %d passes, loss %s, live %v", j.Step, j.BarrierChecks, j.BarrierPasses, loss, j.Live)
		}
	}
	if h.LiarQueries > 0 {
		row("  estimate liars", "%d step queries answered that reported a population of %.0g (see population used)", h.LiarQueries, float64(LiarEstimate))
	}
	if d := h.Drift; d != nil {
		row("  drift poison", "%d models pushed: %d taken, %d refused for distance, %d for rate, %d other; %d victims' models fetched",
			d.Pushes, d.Taken, d.Distance, d.Rate, d.Other, d.ModelsFetched)
	}
}

// SybilFigures reports a run with Sybil roles (part of Hostility).
type SybilFigures struct {
	// IDShare is the Sybils' share of the initial nodes' identities and
	// AddrShare their share of the initial nodes' network addresses.
	IDShare   float64 `json:"sybil_id_share"`
	AddrShare float64 `json:"sybil_addr_share"`
	// SampleShare is the share of the peers drawn in honest nodes'
	// barrier samples that were Sybils, over HonestDraws draws;
	// VictimSampleShare is the same over the victims' samples.
	SampleShare       float64 `json:"sybil_sample_share"`
	HonestDraws       int     `json:"sybil_honest_draws"`
	VictimSampleShare float64 `json:"sybil_victim_sample_share"`
	// Defence says whether the nodes ran the overlay's address limits
	// (overlay.Config.PerAddress).
	Defence bool `json:"sybil_defence"`
	// Victims are the honest nodes the sybil-zone nodes crowd (0 without
	// sybil-zone). VictimError is the median, over the victims and every
	// record of the training, of |N̂ − N| / N of the estimate the node
	// uses (overlay Estimate), with its 95th percentile; VictimZoneError
	// the same of the zone-density estimator alone.
	Victims         int     `json:"sybil_victims,omitempty"`
	VictimError     float64 `json:"sybil_victim_median_rel_error"`
	VictimErrorP95  float64 `json:"sybil_victim_p95_rel_error"`
	VictimZoneError float64 `json:"sybil_victim_zone_median_rel_error"`
	// PrefixBits is how many leading bits of a victim's key each
	// sybil-zone node's key shares at least, and KeygensMean the keys
	// generated per sybil-zone node to find one.
	PrefixBits  int     `json:"sybil_prefix_bits,omitempty"`
	KeygensMean float64 `json:"sybil_keygens_mean,omitempty"`
}

// print writes the Sybil rows of the summary.
func (f *SybilFigures) print(row func(k, format string, a ...any)) {
	row("  sybils", "%.1f %% of identities, %.1f %% of addresses; %.2f %% of honest barrier-sample draws (%d draws), %.2f %% of the victims'; defence %v",
		100*f.IDShare, 100*f.AddrShare, 100*f.SampleShare, f.HonestDraws, 100*f.VictimSampleShare, f.Defence)
	if f.Victims > 0 {
		row("  victims", "%d: population error median %.1f %%, p95 %.1f %% (zone estimator alone: median %.1f %%); keys share >= %d bits with a victim's, %.0f keys generated per Sybil",
			f.Victims, 100*f.VictimError, 100*f.VictimErrorP95, 100*f.VictimZoneError, f.PrefixBits, f.KeygensMean)
	}
}

// HogFigures is what a run with stream-hog, conn-hog or log-flood nodes
// measured.
type HogFigures struct {
	Identities      int64  `json:"identities"`
	StreamsOpened   uint64 `json:"streams_opened"`
	HalfOpenSockets uint64 `json:"half_open_sockets_opened"`
	JunkConnections uint64 `json:"junk_connections"`
	// FreshTried and FreshAnswered count fresh peers that tried to
	// connect to the target and ask its step, one every 2 s, and those
	// that were answered.
	FreshTried    uint64 `json:"fresh_peers_tried"`
	FreshAnswered uint64 `json:"fresh_peers_answered"`
	// TargetConnectionsMax is the most connections the target held (read
	// every 2 s), and TargetTrimmed what it closed to hold its bound.
	TargetConnectionsMax int64  `json:"target_connections_max"`
	TargetTrimmed        uint64 `json:"target_connections_trimmed"`
	// TargetEvicted counts the idle step streams the target reset to make
	// room (psp_hostile_messages_total{kind=step_stream_evicted}).
	TargetEvicted uint64 `json:"target_step_streams_evicted"`
}

func (h *HogFigures) print(row func(k, format string, a ...any)) {
	row("  hogs", "%d identities; %d step streams held, %d half-open sockets, %d junk connections opened; fresh peers answered by the target: %d of %d",
		h.Identities, h.StreamsOpened, h.HalfOpenSockets, h.JunkConnections, h.FreshAnswered, h.FreshTried)
	row("    target", "at most %d connections held, %d trimmed, %d idle step streams evicted", h.TargetConnectionsMax, h.TargetTrimmed, h.TargetEvicted)
}

// LiarEstimate is the population an estimate-liar node reports in its
// step queries: the largest a node accepts.
const LiarEstimate = 1e9
