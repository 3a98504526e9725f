// Package node is the pspnode daemon: the libp2p host, the step and model
// protocols, and the training engine loop (compute a step, publish the
// update, pass the barrier, repeat).
//
// A program builds a Node with New from a Config, its settings (start
// from DefaultConfig, or DefaultLocalConfig for nodes on one machine or
// LAN; Validate names any field out of range), and options for what it
// runs with: WithTask (the work of a step: its own, see the package
// example), WithHost, WithLogger, WithRegistry.
// Then it calls Run. There are two ways to stop, as in
// hashicorp/memberlist: Leave tells peers the node goes (they drop it at
// once), then closes it; Close closes everything at once, with no word to
// peers (a crash, as they see it). Run then returns ErrClosed. A host
// given with WithHost belongs to the node from New on, even when New
// fails.
//
// A program with its own training loop, in this process or another,
// drives a node instead of Run: Config.Driven and Node.Driver (driver.go).
// The trainer API (package node/trainer, `pspnode run --trainer`) is such
// a program: a gRPC service through which a trainer process in any
// language drives the node.
//
// Where things are:
//
//	node.go        Node, New, Leave, Close: the host, the overlay, the exchange
//	config.go      Config, DefaultConfig, DefaultLocalConfig
//	options.go     New's options: WithHost, WithTask (or a driven node's WithModel), WithLogger, WithRegistry
//	validate.go    Config.Validate: ranges, the order of bounds, the sub-configurations
//	engine.go      Run: the step loop
//	barrier.go     the barrier: psp.Checker's policy driven by a thin I/O loop (draws, step queries, timers, progress wakes)
//	driver.go      Driver: the step loop's parts for a program with its own loop (a trainer)
//	timing.go      barrier timing: Config's shares, floors and caps for psp.BarrierTiming
//	population.go  the population estimate that scales the learning rate
//	observe.go     a check's answers: judging replies, late answers, what they tell the overlay in one call
//	isolation.go   the peers heard from and the isolated state (psp.Isolated is the policy): an isolated node waits
//	join.go        waitPeers, resume from a checkpoint (its file format: internal/checkpoint), join a running job
//	genesis.go     lineages of a job (internal/lineage) and models at first contact: forks converge on the older, other models are held out
//	exchange.go    the node's exchange (package exchange): built when the model is attached, told what the node knows of its peers
//	progress.go    feeding the peers' known steps (internal/progress), and waking the peers this node held back
//	steps.go       the node's side of the step protocol: what it asks, what it answers (messages and streams: internal/wire)
//	modelproto.go  the node's side of the model protocol: a joiner fetches the current model
//	task.go        Task, the optional interfaces a task may add, and the task of a node given none
//	private.go     private jobs: the swarm key (pnet) and the allow-list in Config (cmd/pspnode reads their files)
//	traffic.go     Node.Traffic: what the node's streams carried (package status counts it)
//	faults.go      the internal/faults hooks: misbehaviour for testnets that measure the defences
//	version.go     the module version and the identify agent string
//	metrics.go     the gauges read off the overlay and the host at a scrape (the rest: status.Metrics)
//	http.go        Node.Status, Node.Health and Node.Handler: /status, /health and /metrics (package status)
//	nat.go         Config.NAT's host options (the bootstrap peers as relays) and Node.NAT
//
// How the host meets the network is in the sub-package netsetup: the
// connection gate of a private job and the transports (netsetup/gate.go),
// and NAT traversal: AutoNAT, relays, hole punching, go-libp2p's, and what
// /status says of them (netsetup/nat.go).
package node
