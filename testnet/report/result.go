package report

import (
	"encoding/json"
	"math"
	"time"

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

	// Rows are the run's time series (WriteOut's CSV files), not in the
	// JSON.
	Rows Rows `json:"-"`
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
	// joiner-wedge and drift-poison roles (testnet/hostile).
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

// Resources is what the testnet process held at a quarter of the training
// time and at its end, for long runs that look for slow leaks: a leak
// shows as a count that grows between the two while the live population
// stays about the same.
//
// Heap is the live heap after a forced collection (the collector's
// growth target would otherwise make it swing by a factor of GOGC/100).
// Stacks are the goroutines' stacks, which the heap does not count: at
// a thousand nodes, most of a node's goroutines wait on idle streams.
// The goroutine figures count every goroutine of the process; the per
// node figure divides them by the live nodes. GoroutinesOfDeparted counts
// goroutines still running at the end on behalf of nodes that left or
// crashed at least DepartedGrace earlier: each node's goroutines carry a
// pprof label with its number, inherited by every goroutine they start.
// Goroutines that a peer starts to serve a node carry the peer's label,
// so this counts what a departed node itself left running.
type Resources struct {
	RSSBytesAtQuarter        int64   `json:"rss_bytes_at_quarter"`
	RSSBytesEnd              int64   `json:"rss_bytes_end"`
	HeapBytesAtQuarter       uint64  `json:"heap_bytes_at_quarter"`
	HeapBytesEnd             uint64  `json:"heap_bytes_end"`
	StackBytesAtQuarter      uint64  `json:"stack_bytes_at_quarter"`
	StackBytesEnd            uint64  `json:"stack_bytes_end"`
	GoroutinesAtQuarter      int     `json:"goroutines_at_quarter"`
	GoroutinesEnd            int     `json:"goroutines_end"`
	LiveAtQuarter            int     `json:"live_at_quarter"`
	LiveEnd                  int     `json:"live_end"`
	GoroutinesPerNodeQuarter float64 `json:"goroutines_per_node_at_quarter"`
	GoroutinesPerNodeEnd     float64 `json:"goroutines_per_node_end"`
	Departed                 int     `json:"departed"` // nodes gone at least DepartedGrace before the end
	GoroutinesOfDeparted     int     `json:"goroutines_of_departed"`
}

// DepartedGrace is how long after a node leaves its goroutines may still
// wind down (bounded library sleeps, in-flight stream deadlines) before
// Resources counts them as left over.
const DepartedGrace = 30 * time.Second

// Membership is what the honest live nodes' overlays hold at the end of a
// run: means over those nodes, and the largest. Peers that name peers
// which do not exist (the fake-peers role) show here.
type Membership struct {
	// Members counts the known peers not known to be dead, Unconfirmed
	// those of them known only from other nodes (named in a lookup reply,
	// with no first-hand evidence of life yet), Dead the peers held dead,
	// and Drawable the peers Sample draws from (overlay.Status).
	Members        float64 `json:"members_mean"`
	MembersMax     int     `json:"members_max"`
	Unconfirmed    float64 `json:"unconfirmed_mean"`
	UnconfirmedMax int     `json:"unconfirmed_max"`
	Dead           float64 `json:"dead_mean"`
	Drawable       float64 `json:"drawable_mean"`
	// SampleUs is the wall time of one Sample(β) call, in microseconds:
	// the mean of sampleCalls calls on every honest live node, one node
	// after another, at the end of training. 0 when the run cannot read a
	// wall clock (the virtual clock without Config.WallClock).
	SampleUs float64 `json:"sample_us"`
}

// TrafficReport is what the honest live nodes' streams carried during
// training (status.Traffic, from each node's launch to the end), per node:
// bytes per second of training, bytes received per step taken, and the
// same by protocol class (status.Classes).
type TrafficReport struct {
	InBytesPerNodeS  float64 `json:"in_bytes_per_node_s"`
	OutBytesPerNodeS float64 `json:"out_bytes_per_node_s"`
	InBytesPerStep   float64 `json:"in_bytes_per_step"`
	// ByProtocol holds each class's bytes per node per second.
	ByProtocol map[string]ClassTraffic `json:"by_protocol"`
	// GossipAmplification is the GossipSub bytes the nodes received per
	// byte of update payload GossipSub delivered to them (absent without
	// gossip).
	GossipAmplification float64 `json:"gossip_amplification,omitempty"`
}

// ClassTraffic is one protocol class's bytes per node per second.
type ClassTraffic struct {
	InBytesPerNodeS  float64 `json:"in_bytes_per_node_s"`
	OutBytesPerNodeS float64 `json:"out_bytes_per_node_s"`
}

// Comparison sets the testnet beside the simulator run with the same
// parameters, twice: Sim in fidelity mode (every waiting node re-checks at
// every completion, as the paper's simulator does) and Poll in poll mode,
// where waiting nodes re-check every PollIntervalS, the interval the
// testnet's nodes kept (1 / ChecksPerWaitS). Ratio and PollRatio are
// real/simulated for each step figure.
type Comparison struct {
	Sim           sim.Stats
	Ratio         map[string]float64
	PollIntervalS float64
	Poll          sim.Stats
	PollRatio     map[string]float64
}

// MarshalJSON keeps NaN (ratios of zero) out of the JSON.
func (c Comparison) MarshalJSON() ([]byte, error) {
	finite := func(m map[string]float64) map[string]*float64 {
		out := map[string]*float64{}
		for k, v := range m {
			if !math.IsNaN(v) && !math.IsInf(v, 0) {
				out[k] = &v
			} else {
				out[k] = nil
			}
		}
		return out
	}
	return json.Marshal(struct {
		Sim           sim.Stats           `json:"sim_steps"`
		Ratio         map[string]*float64 `json:"ratio"`
		PollIntervalS float64             `json:"poll_interval_s"`
		Poll          sim.Stats           `json:"poll_steps"`
		PollRatio     map[string]*float64 `json:"poll_ratio"`
	}{c.Sim, finite(c.Ratio), c.PollIntervalS, c.Poll, finite(c.PollRatio)})
}
