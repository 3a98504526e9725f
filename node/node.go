package node

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	ma "github.com/multiformats/go-multiaddr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pspnode/pspnode/internal/wire"
	"github.com/pspnode/pspnode/node/barrier"
	"github.com/pspnode/pspnode/node/exchange"
	"github.com/pspnode/pspnode/node/netsetup"
	"github.com/pspnode/pspnode/node/status"
	"github.com/pspnode/pspnode/overlay"
	"github.com/pspnode/pspnode/psp"
)

// ErrClosed is returned by calls on a closed Node.
var ErrClosed = barrier.ErrClosed

// ModelMismatchError says that a peer runs another model than this node:
// another model ID or parameter count. It is not a malformed message: the
// two nodes must not be in one job.
type ModelMismatchError struct {
	Peer       string // the peer's ID; "" when not known
	PeerModel  uint32
	PeerParams int64
	OwnModel   uint32
	OwnParams  int64
}

func (e *ModelMismatchError) Error() string {
	who := "the peer"
	if e.Peer != "" {
		who = "peer " + e.Peer
	}
	return fmt.Sprintf("model mismatch: %s runs model id %#08x with %d parameters; this node runs model id %#08x with %d",
		who, e.PeerModel, e.PeerParams, e.OwnModel, e.OwnParams)
}

// Node is one pspnode: a libp2p host, its overlay membership, its gossip
// topic, the step and model protocols, and the training engine.
type Node struct {
	cfg Config
	log *slog.Logger
	h   host.Host
	// givenHost: h wraps a host given with WithHost, not one New built.
	givenHost bool
	ov        *overlay.Overlay
	// ready is closed when New is done; up says whether it succeeded. The
	// inbound handlers are registered before the overlay exists (peers can
	// find a joining node in the DHT and query it before New returns), so
	// they wait on ready before touching ov or gs.
	ready chan struct{}
	up    atomic.Bool
	// life ends when the node shuts down (endLife): the inbound stream
	// handlers derive their contexts from it, so none outlives the node.
	// active ends when the node leaves (Leave) or shuts down: Run and the
	// barrier stop with it.
	life      context.Context
	endLife   context.CancelFunc
	active    context.Context
	endActive context.CancelFunc
	// The model's parts, set once by attachModel (under modelMu), which
	// sets modelUp last; code that may run beside attachModel checks
	// modelUp first (n.exch() does). ex is the exchange, gossip or
	// epidemic (exchange.go), nil for a task without a model; xm the
	// exchange protocol's metrics, nil for a task without a model.
	modelMu   sync.Mutex
	modelUp   atomic.Bool
	closing   bool // under modelMu: Close has begun, attach no more
	ex        exchange.Exchange
	exIn      *wire.Inbound
	events    chan<- Event // WithEvents; nil for none
	model     Model        // the task, or a driven node's model
	work      Task         // the task Run steps; nil for a driven node
	decider   psp.Decider
	bar       *barrier.Barrier // the barrier: its Checker, its I/O and what it keeps of peers (node/barrier)
	reg       *prometheus.Registry
	m         *status.Metrics
	stepExtID protocol.ID // step protocol 1.1.0
	started   time.Time
	boot      startup // where start-up went (startup.go)
	rngMu     sync.Mutex
	rng       *rand.Rand
	step      atomic.Int64
	leaving   atomic.Bool
	// idle: the node is not training (a driven node without a trainer),
	// so it answers step queries as leaving: its peers leave it out of
	// their barriers and population (see Driver).
	idle       atomic.Bool
	lastStepAt time.Time // when the last step ended; the stepping goroutine's
	driver     *Driver
	interval   atomic.Uint64 // float64 bits: EWMA seconds per step
	compute    atomic.Uint64 // float64 bits: EWMA seconds of task compute per step
	busy       atomic.Bool   // inside task.Step
	lastEval   atomic.Pointer[evalResult]
	// pop is the population estimate (population.go).
	pop *census
	// meter counts the bytes of the node's streams (traffic.go).
	meter *status.Meter
	// conns counts opened connections into opened.
	conns  *network.NotifyBundle
	opened atomic.Uint64
	// guard bounds the host's connections (connbound.go).
	guard *connGuard
	// The step protocol (steps.go): asker keeps idle streams for reuse;
	// stepIn caps concurrent inbound step streams.
	asker      *wire.Asker
	stepServer *wire.StepServer
	stepIn     *wire.Inbound
	mp         *modelProto // the model protocol (modelproto.go)
	// resets holds realignments to their rate (resets.go).
	resets resetGate
	// nat follows reachability, relays and hole punches (package netsetup).
	nat *netsetup.NAT
	// iso is the peers heard from lately, the last leave and the node's
	// isolated state (isolation.go).
	iso *isolation
	// kin judges which peers are of the job: the model and the lineage
	// (genesis.go).
	kin *kinship

	leaveOnce sync.Once
	closeOnce sync.Once
	closeErr  error
}

type evalResult struct {
	Step     int64
	Loss     float64
	Accuracy float64
}

// A Driver runs a node's steps for a program that has its own training
// loop, such as a trainer process behind the trainer API (package
// node/trainer), instead of Run and a Task's Step. The node keeps the
// membership, the population estimate, the barrier and the exchange; the
// driving program owns the model and the compute, and tells the node what
// it did. A node is driven when built with Config.Driven.
//
// A driven node counts as a participant in its peers' barriers and
// population only while it is active: between Activate and Deactivate
// (one session of a trainer). Otherwise it answers step queries as a
// leaving node does, so no peer waits on a node that is not training, and
// it discards the updates it receives.
//
// A session: Begin (wait for the job, then the step and model to start
// from), Activate, then for each step Barrier, the program's compute, Done
// and (under the epidemic exchange) Merge; Deactivate when the program
// goes. The first step of a session passes its barrier without a check,
// as Run's first step does. Calls are serialised.
type Driver struct {
	n *Node

	mu          sync.Mutex // one call at a time
	first       psp.Step   // the session's first step
	passed      psp.Step   // the last step whose barrier passed
	computeFrom time.Time  // when it passed: the program's compute starts

	infoMu sync.Mutex // guards client (not mu: Status must not wait for a barrier)
	client string     // who drives, for status.Status

	resetMu sync.Mutex
	reset   *Reset // the job's state the program must take (TakeReset); nil for none
}

// ID is the node's peer ID.
func (n *Node) ID() peer.ID { return n.h.ID() }

// Host is the node's libp2p host.
func (n *Node) Host() host.Host { return n.h }

// Overlay is the node's overlay.
func (n *Node) Overlay() *overlay.Overlay { return n.ov }

// Model is the node's model: its task (WithTask), or a driven node's
// model (WithModel).
func (n *Node) Model() Model { return n.model }

// Registry is the node's metrics registry.
func (n *Node) Registry() *prometheus.Registry { return n.reg }

// Step is the number of iterations the node has completed.
func (n *Node) Step() psp.Step { return n.step.Load() }

// Waiting reports whether the node is waiting at its barrier.
func (n *Node) Waiting() bool { return n.bar.Waiting() }

// Addrs returns the node's dialable multiaddrs, each ending in /p2p/<id>.
func (n *Node) Addrs() []ma.Multiaddr {
	addrs, err := peer.AddrInfoToP2pAddrs(&peer.AddrInfo{ID: n.h.ID(), Addrs: n.h.Addrs()})
	if err != nil {
		return nil
	}
	return addrs
}

// emit sends an event to the channel of WithEvents without waiting: an
// event that finds it full is dropped and counted
// (psp_events_dropped_total), so a slow reader never holds the node up.
func (n *Node) emit(kind EventKind, p peer.ID) {
	if n.events == nil {
		return
	}
	select {
	case n.events <- Event{Kind: kind, Peer: p, Step: n.step.Load(), At: time.Now()}:
	default:
		n.m.EventsDropped.Inc()
	}
}
