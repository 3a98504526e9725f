// Package node is the pspnode daemon: a libp2p host that trains in a job
// with its peers, under a probabilistic synchronous barrier (package psp).
//
// The happy path: start from DefaultConfig (DefaultLocalConfig on one
// machine or LAN), set Job, Bootstrap (empty for the first node) and
// Barrier, and build the node with New and what it runs with: WithTask
// (the work of a step; see the package example), and optionally
// WithEvents (peers met and gone, steps taken), WithLogger, WithRegistry,
// WithHost. Run steps until ctx ends, MaxSteps or the task is done. Stop
// with Leave (tell the peers, then close) or Close (at once, as a crash);
// Run then returns ErrClosed. Status, Handler (/status, /health,
// /metrics; package status serves it) and Traffic say how it goes.
//
// A program with its own training loop drives the node instead of Run:
// Config.Driven, WithModel (its model: no Task) and Node.Driver (see
// ExampleDriver). The trainer API (package node/trainer, `pspnode run
// --trainer`) is such a program, for a trainer process in any language.
// A private job sets Config.PSK (see Example_privateJob).
package node

// Where things are (for the people who work on this package):
//
//	node.go        the Node and Driver types (their state), ErrClosed, ModelMismatchError, the accessors
//
// The node coordinates; its parts hold their state and are told only what
// they need of the node. The barrier is a package of its own (node/barrier:
// the Checker, peers' known steps and paces, the wedge), given the node's
// other parts behind narrow interfaces (barrier.Census, Isolation, Kin,
// Startup, and barrier.Node for the realignment and the events: the
// adapter barrierHooks in pace.go). The others are types in this package:
//
//	kinship       genesis.go: who is of the job (the model's identity, the lineage), the peers held out
//	modelProto    modelproto.go: the model protocol, served within a byte budget and fetched from peers
//	census        population.go: the node's own estimate and the population the learning rate follows
//	isolation     isolation.go: the peers heard from lately, the isolated state
//	resetGate     resets.go: how often the node may take the job's step and model
//	connGuard     connbound.go: the connection bound and the inbound guard
//
// The files:
//
//	lifecycle.go   New, Leave, Close: building the host, the barrier (checkConfig: Config's shares, floors and caps), the overlay, the exchange
//	config.go      Config, DefaultConfig, DefaultLocalConfig
//	options.go     New's options: WithHost, WithTask (or a driven node's WithModel), WithLogger, WithRegistry
//	validate.go    Config.Validate: ranges, the order of bounds, the sub-configurations
//	engine.go      Run: the step loop, and where a task's float64 parameters and updates meet the float32 exchange
//	driver.go      Driver's calls: the step loop's parts for a program with its own loop (a trainer)
//	driver_peers.go Driver.Member: which peers count as the job's for what a trainer serves
//	population.go  the population estimate that scales the learning rate (psp.Population is the rule)
//	isolation.go   the peers heard from (progress.Heard) and the isolated state (psp.Isolated is the policy): an isolated node waits
//	join.go        waitPeers, resume from a checkpoint (its file format: internal/checkpoint), join a running job
//	genesis.go     lineages of a job (internal/lineage) and models at first contact: forks converge on the older, other models are held out
//	exchange.go    the node's exchange (package exchange): built when the model is attached, told what the node knows of its peers; the gossip topic's waits and counts
//	pace.go        each peer's pace as the barrier's checks saw it (Node.PeerPace), and the barrier's hooks into the node
//	realign.go     moving onto the job's lineage, or back from far ahead: the job's step and model taken as at a join
//	resets.go      the rate at which realignments may reset the node's step and model
//	startup.go     where start-up went: the milestones /status reports
//	steps.go       the node's side of the step protocol: what it asks, what it answers (messages and streams: internal/wire)
//	modelproto.go  the node's side of the model protocol: a joiner fetches the current model
//	task.go        Model, Task, the optional interfaces a task may add, and the task of a node given none
//	events.go      Event and WithEvents: membership and progress on the program's channel
//	private.go     private jobs: the swarm key (pnet) and the allow-list in Config (cmd/pspnode reads their files)
//	traffic.go     Node.Traffic: what the node's streams carried (package status counts it)
//	faults.go      the internal/faults hooks: misbehaviour for testnets that measure the defences
//	version.go     the module version and the identify agent string
//	metrics.go     the gauges read off the overlay and the host at a scrape (the rest: status.Metrics)
//	http.go        Node.Status, Node.Health and Node.Handler: /status, /health and /metrics (package status)
//	nat.go         Config.NAT's host options (the bootstrap peers as relays) and Node.NAT
//	connbound.go   the loops that bound connections and guard the inbound limit (netsetup's limits.go)
//
// The rooms around it: the wire formats (internal/wire), the exchanges
// (node/exchange), how the host meets the network (node/netsetup: the
// gate of a private job, NAT traversal, connection limits), what the node
// shows (node/status), the lineage and the peers' progress
// (internal/lineage, internal/progress), whole-node tests (node/e2e).
