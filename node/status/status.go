// Package status is what a node shows the people who run it: Status (the
// JSON of /status), the Traffic its streams carried (Meter), its
// Prometheus metrics (Metrics, names psp_*), and the HTTP handler and
// server of /status, /health and /metrics (Handler, Serve). Package node
// fills them; a program that embeds nodes reads them (Node.Status,
// Node.Handler).
package status

import (
	"github.com/pspnode/pspnode/node/exchange"
	"github.com/pspnode/pspnode/node/netsetup"
	"github.com/pspnode/pspnode/overlay"
)

// Status is what /status reports.
type Status struct {
	PeerID             string   `json:"peer_id"`
	Addrs              []string `json:"addrs"`
	Job                string   `json:"job"`
	Barrier            string   `json:"barrier"`
	Step               int64    `json:"step"`
	PopulationEstimate float64  `json:"population_estimate"`
	EstimateStderr     float64  `json:"population_estimate_stderr"`
	EstimateError      string   `json:"population_estimate_error,omitempty"`
	RoutingTableSize   int      `json:"routing_table_size"`
	KnownPeers         int      `json:"known_peers"`
	ConnectedPeers     int      `json:"connected_peers"`
	// ConnectionsOpened counts connections opened since the node started,
	// inbound and outbound.
	ConnectionsOpened uint64 `json:"connections_opened"`
	// ConnectionsTrimmed counts the connections the node closed to hold
	// at most ConnHigh (package node's connbound.go); StepDials the step queries that
	// had to dial (the peer was not connected).
	ConnectionsTrimmed uint64 `json:"connections_trimmed"`
	StepDials          uint64 `json:"step_dials"`
	Waiting            bool   `json:"waiting"`
	// Isolated: the node's last barrier check heard from no peer of the
	// job, so it waits at its barrier until one answers (package node's isolation.go);
	// IsolatedSince is when that began (RFC 3339).
	Isolated      bool   `json:"isolated"`
	IsolatedSince string `json:"isolated_since,omitempty"`
	// Idle: a driven node without a trainer; its peers leave it out of
	// their barriers and population. Trainer names the trainer driving
	// it ("" for none).
	Idle          bool    `json:"idle,omitempty"`
	Trainer       string  `json:"trainer,omitempty"`
	UptimeS       float64 `json:"uptime_s"`
	StepIntervalS float64 `json:"step_interval_s"`
	// BarrierChecks counts barrier checks, BarrierPasses the checks that
	// let the node go on (one per step), BarrierWaitS the total time spent
	// at the barrier.
	BarrierChecks uint64  `json:"barrier_checks"`
	BarrierPasses uint64  `json:"barrier_passes"`
	BarrierWaitS  float64 `json:"barrier_wait_s"`
	OverlayReady  bool    `json:"overlay_ready"`
	SinceRefreshS float64 `json:"since_refresh_s"`
	// PoolInDegree is how many peers' sampler pools hold this node (their
	// samples draw it with weight pool size / in-degree); PoolRefused
	// counts malformed pool announcements refused.
	PoolInDegree int      `json:"pool_in_degree"`
	PoolRefused  int      `json:"pool_requests_refused"`
	Model        string   `json:"model,omitempty"`
	Loss         *float64 `json:"loss,omitempty"`
	Accuracy     *float64 `json:"accuracy,omitempty"`
	// Updates counts what the exchange carried: under gossip, updates
	// published and received on the topic; under epidemic, models sent to
	// peers (one per peer) and taken from them. Exchange details it.
	UpdatesSent     uint64          `json:"updates_sent"`
	UpdatesReceived uint64          `json:"updates_received"`
	UpdatesRejected uint64          `json:"updates_rejected"`
	Exchange        *exchange.Stats `json:"exchange,omitempty"`
	// Defences at work: step reports not counted at the barrier (stuck or
	// lying peers), received updates refused by the norm bound, inbound
	// streams reset at the per-peer cap.
	ReportsScreened    uint64 `json:"reports_screened"`
	UpdatesNormRefused uint64 `json:"updates_norm_refused"`
	StreamsRefused     uint64 `json:"streams_refused"`
	// StreamsRefusedBy splits StreamsRefused by protocol (step, model,
	// exchange): each has caps of its own.
	StreamsRefusedBy map[string]uint64 `json:"streams_refused_by_protocol"`
	// Lineage is the node's Genesis in hex ("" for none); ForksJoined
	// counts the times it left its lineage for the job's, and
	// PeersHeldOut the peers it holds out for running another model
	// (package node's genesis.go). Resets counts the times it replaced
	// its step and model by the job's (a fork joined, or a wedge left),
	// ResetsRefused those it refused for their rate (resets.go).
	Lineage       string `json:"lineage,omitempty"`
	ForksJoined   uint64 `json:"forks_joined"`
	PeersHeldOut  int    `json:"peers_held_out"`
	Resets        uint64 `json:"resets"`
	ResetsRefused uint64 `json:"resets_refused"`
	// JoinStatus says whether the node has joined, and if not why.
	overlay.JoinStatus
	// Traffic is what the node's streams carried, by protocol class.
	Traffic Traffic `json:"traffic"`
	// NAT is the node's reachability, relay addresses and connections by
	// kind (netsetup/nat.go).
	NAT netsetup.NATStatus `json:"nat"`
	// Startup is where the node's start-up went.
	Startup Startup `json:"startup"`
}

// Startup is where a node's start-up went (/status "startup"): each
// milestone in seconds since the process started (FromProcess; else since
// the node was built), absent until reached.
type Startup struct {
	FromProcess bool `json:"from_process"`
	// NodeS: the node began to be built (the process's own start-up
	// before it: the runtime, flags, the identity file).
	NodeS *float64 `json:"node_s,omitempty"`
	// ListeningS: its host listens; ReadyS: it answers its peers (its
	// overlay built, the bootstrap peers dialled).
	ListeningS *float64 `json:"listening_s,omitempty"`
	ReadyS     *float64 `json:"ready_s,omitempty"`
	// FirstPeerS: it knows a peer of its job.
	FirstPeerS *float64 `json:"first_peer_s,omitempty"`
	// SessionS: a trainer's session began (its Hello, its model fixed);
	// WelcomeS: the session's start (step, parameters) was settled and
	// the trainer welcomed; FirstStepS: its first step was counted.
	SessionS   *float64 `json:"session_s,omitempty"`
	WelcomeS   *float64 `json:"welcome_s,omitempty"`
	FirstStepS *float64 `json:"first_step_s,omitempty"`
}
