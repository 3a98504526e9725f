package node

import (
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/pnet"

	"github.com/pspnode/pspnode/gossip"
	"github.com/pspnode/pspnode/internal/faults"
	"github.com/pspnode/pspnode/internal/lineage"
	"github.com/pspnode/pspnode/node/exchange"
	"github.com/pspnode/pspnode/node/netsetup"
	"github.com/pspnode/pspnode/overlay"
	"github.com/pspnode/pspnode/psp"
)

// Config configures a Node: its settings, all data, which Validate checks.
// Start from DefaultConfig (or DefaultLocalConfig) and set what differs.
// What the node runs with (a host, a task, a logger, a metrics registry)
// is given to New as options (WithHost, WithTask or WithModel,
// WithLogger, WithRegistry).
type Config struct {
	// Job names the training job; it namespaces every protocol and topic
	// (/psp/<job>/...). Letters, digits, '.', '_' and '-'.
	Job string
	// Listen are the multiaddrs the host listens on. Not used with
	// WithHost.
	Listen []string
	// Bootstrap are multiaddrs ending in /p2p/<id> to join through; empty
	// for the first node of a job. An address without a peer ID
	// ("host:port", or a TCP multiaddr without /p2p) names a peer by its
	// address alone: its ID is learnt by a handshake at the join (package
	// overlay, rendezvous.go), secured by PSK when set; the node's own
	// address is left out, and a node given only its own starts the job.
	Bootstrap []string
	// MDNS announces the node on its local network and connects to the
	// peers of its job found there (mDNS): workers on one LAN find each
	// other with no address at all. Off by default: it tells every host
	// of the network that a node of the job runs here, and where.
	MDNS bool
	// Identity is the host's private key; nil makes a fresh one. Not used
	// with WithHost.
	Identity crypto.PrivKey
	// PSK, if set (32 bytes, ReadSwarmKey), makes the job private: every
	// connection is encrypted with it from its first byte, so a peer
	// without it cannot connect. Only TCP runs (QUIC, WebTransport and
	// WebRTC cannot carry it): Listen must hold TCP addresses only.
	// AllowPeers, if not empty, refuses every peer not in it. Both need a
	// host the node builds (not WithHost).
	PSK        pnet.PSK
	AllowPeers []peer.ID

	// Limits bounds the node's connections and step streams.
	Limits LimitsConfig

	// NAT turns on NAT traversal: AutoNAT, a relay service, auto-relay
	// through the bootstrap peers and hole punching (package netsetup).
	// Not used with WithHost.
	NAT netsetup.NATConfig

	// Barrier is the barrier every step must pass; Check how its checks
	// run (the defaults suit every barrier).
	Barrier psp.Spec
	Check   CheckConfig
	// Driven makes the node's steps come from a program with its own
	// training loop, through Node.Driver, instead of Run (see Driver):
	// the trainer API of node/trainer. Its model (WithModel, no Task) is
	// then required, and the node stays out of its peers' barriers until
	// the Driver activates it. A model with no parameters yet gets its
	// exchange when it has them (Driver.Attach).
	Driven bool

	// MaxSteps stops the node after this many steps (0: no limit).
	MaxSteps int64
	// Duration stops the node after this long (0: no limit).
	Duration time.Duration
	// WaitPeers makes Run wait, before the first step, until the overlay
	// knows this many peers (or StartTimeout passes).
	WaitPeers int
	// StartTimeout bounds the wait for WaitPeers.
	StartTimeout time.Duration

	// JoinFetch makes a node that joins a running job fetch the model from
	// a peer and adopt a step (psp.JoinStep) before training. It also
	// makes the node take the lineage (Genesis) of the peers it joins, or
	// start one, and move to the lineage most of a uniform sample of its
	// peers is on when it meets another (genesis.go, realign.go).
	JoinFetch bool
	// Genesis, if not zero, is the node's lineage of the job from the
	// start, instead of the one its join finds: for nodes that start a
	// job together (a testnet), which would otherwise each start their
	// own and then converge on one.
	Genesis lineage.Genesis
	// ScaleLR scales a model task's learning rate by 1/N̂ (the population
	// estimate), so that the updates of all nodes add up to one step of the
	// mean gradient instead of N steps.
	ScaleLR bool
	// Checkpoint, if set, is a file the node writes its step and model to
	// every CheckpointEvery steps and when it stops, and resumes from when
	// it starts. A corrupt or mismatched checkpoint is reported and ignored:
	// the node then fetches the model from peers.
	Checkpoint      string
	CheckpointEvery int
	// EvalEvery evaluates the model every this many steps (0: never).
	EvalEvery int

	// Screen holds peers to their earlier step reports (psp.Screen): a peer
	// whose step went backwards, or has not advanced for many of this
	// node's step intervals, does not count at the barrier and is replaced
	// by a fresh draw. The zero ScreenConfig turns screening off.
	Screen psp.ScreenConfig

	// Exchange is how nodes combine their work, and the limits of what a
	// node takes from its peers (package exchange): epidemic:4 by
	// default (each step's model to 4 sampled peers, which average what
	// they receive), or gossip (every delta to every node over
	// GossipSub). Nodes of one job must agree on the kind.
	Exchange exchange.Config

	// Overlay and Gossip configure the subsystems; Job and the bootstrap
	// peers are filled in from the fields above, and the gossip topic's
	// limits from Exchange.
	Overlay overlay.Config
	Gossip  gossip.Config

	// Seed seeds the node's random streams (0: derived from its peer ID)
	// and, unless Overlay.Seed is set, the overlay's sampling, through a
	// seed derived from this one: a seeded node draws the same samples
	// given the same events. With Seed 0 the overlay draws from
	// crypto/rand.
	Seed uint64
	// UserAgent is the identify agent version a host the node builds
	// advertises; "" is pspnode/<Version()>. IdentifyProtocol is its
	// protocol version.
	UserAgent string

	// faults make the node misbehave, or report its samples, for testnets
	// that measure the defences above (set through internal/faults). The
	// zero value is an honest node.
	faults faults.Node
	// hostFaults change what a host the node builds announces and
	// accepts, for tests on one machine that play relays and NATs.
	hostFaults faults.Host
}

// CheckConfig is how a node's barrier checks run: how many failed queries
// are replaced, how often a waiting node checks again, and how long a
// step query may take. Every interval follows the node's own measured
// compute time per step and query round trip (see psp.BarrierTiming for
// the rules); the durations here are floors and caps.
type CheckConfig struct {
	// Replacements is how many times peers that did not answer a barrier
	// query are replaced by fresh draws within one check.
	Replacements int
	// GlobalQueries bounds the step queries a global barrier's check
	// (BSP, SSP, DSSP: every known peer is asked) has in flight at once
	// (0: no bound).
	GlobalQueries int

	// PollShare bounds how often a node waiting at a sampled barrier
	// (pBSP, pSSP, pDSSP) re-checks: it re-checks once per expected step
	// completion in the population (mean compute time / N̂, as the
	// paper's simulator does at every completion), but no more often
	// than every PollShare × mean compute time, in (0, 1]. A waiting node
	// sends at most β/PollShare queries per step time spent waiting.
	PollShare float64
	// GlobalPollShare is the same for global barriers (BSP, SSP, DSSP),
	// which ask every known peer not yet seen at the threshold and are
	// woken by the progress reports of the peers they wait for; polling is
	// their safety net.
	GlobalPollShare float64
	// PollMin is the least interval between two checks (and the least
	// hedge delay); PollMax the longest. Where they cross, PollMax wins.
	PollMin, PollMax time.Duration
	// QueryTimeout is the longest a step query (dial, request and reply)
	// may take; QueryTimeoutMin the shortest timeout the rules may set.
	// Where they cross, QueryTimeout wins.
	QueryTimeout, QueryTimeoutMin time.Duration
	// Pace is the pace rule of pBSP and pSSP checks (psp.PaceConfig): a
	// sampled peer behind the threshold that steps more than Factor
	// times slower than this node, or would need more than Horizon of
	// its steps to reach the threshold, is not waited for. The zero
	// value is off (the paper's pBSP and pSSP).
	Pace psp.PaceConfig
}

// LimitsConfig bounds a node's connections and step streams.
type LimitsConfig struct {
	// ConnLow and ConnHigh are the connection manager's watermarks (of a
	// host the node builds; each at most a quarter of its inbound
	// connection limit, which the node raises to 1024 where the file
	// descriptors allow: limits.go).
	ConnLow, ConnHigh int
	// BoundConns makes the node itself hold at most ConnHigh connections
	// (any host, its own or WithHost's): once over, it closes unprotected
	// ones down to ConnLow (connbound.go). Off by default: with uniform
	// sampling from every peer, a bound well below the population turns
	// most step queries into dials.
	BoundConns bool
	// MaxStreamsPerPeer and MaxInboundStreams cap the concurrent inbound
	// step streams from one peer and from all peers; streams over the cap
	// are reset at once. (Model streams have caps of their own, 2 per peer
	// and 64 in all, as exchange streams do.) A real host also gets the
	// per-peer cap for the step, model and exchange protocols in
	// go-libp2p's resource manager.
	MaxStreamsPerPeer, MaxInboundStreams int
	// StepStreams is how many idle step streams a node keeps open for
	// reuse, at most one per peer (0: a stream per query). See wire.Asker.
	StepStreams int
}

// DefaultConfig returns a node configuration for a real network: TCP and
// QUIC on port 4001, NAT traversal and the relay service on,
// pSSP(auto, 4) (a sample of a third of the other nodes, 1 to 10, so
// that a job of a few machines does not run at its slowest one's pace),
// no model.
func DefaultConfig() Config {
	return Config{
		Job:    "default",
		Listen: []string{"/ip4/0.0.0.0/tcp/4001", "/ip4/0.0.0.0/udp/4001/quic-v1", "/ip6/::/tcp/4001", "/ip6/::/udp/4001/quic-v1"},
		Limits: LimitsConfig{
			ConnLow: 64, ConnHigh: 256,
			MaxStreamsPerPeer: 8, MaxInboundStreams: 512,
			StepStreams: 64,
		},
		Barrier: psp.MustParse("pssp:auto:4"),
		Check: CheckConfig{
			Replacements: 2, GlobalQueries: 32,
			PollShare: 1.0 / 64, GlobalPollShare: 1.0 / 4,
			PollMin: 100 * time.Microsecond, PollMax: 500 * time.Millisecond,
			QueryTimeout: time.Second, QueryTimeoutMin: 50 * time.Millisecond,
			Pace: psp.DefaultPaceConfig(),
		},
		StartTimeout:    30 * time.Second,
		JoinFetch:       true,
		EvalEvery:       10,
		CheckpointEvery: 10,
		ScaleLR:         true,
		Screen:          psp.DefaultScreenConfig(),
		Exchange:        exchange.DefaultConfig(),
		Overlay:         overlay.DefaultConfig(),
		Gossip:          gossip.DefaultConfig(),
		NAT:             netsetup.DefaultNATConfig(),
	}
}

// DefaultLocalConfig returns a node configuration for a local network:
// many nodes on one machine (a testnet, tests) or on one LAN, where every
// node reaches every other directly. It is DefaultConfig with
//
//   - one listen address, TCP on loopback on a port the system picks, so
//     that any number of nodes share the machine;
//   - NAT traversal off: no AutoNAT, relay service, auto-relay or hole
//     punching (nor the extra dialer hosts they bring), which a network
//     without NATs does not need;
//   - a step query timeout of 2 s instead of 1 s: nodes that share a
//     machine's cores answer late when it is loaded, and a slow answer
//     must not count as a dead peer.
//
// A node on a LAN sets Listen to an address its peers can reach.
func DefaultLocalConfig() Config {
	c := DefaultConfig()
	c.Listen = []string{"/ip4/127.0.0.1/tcp/0"}
	c.NAT = netsetup.NATConfig{}
	c.Check.QueryTimeout = 2 * time.Second
	return c
}
