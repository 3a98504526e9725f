package exchange

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pspnode/pspnode/gossip"
	"github.com/pspnode/pspnode/internal/faults"
	"github.com/pspnode/pspnode/internal/ring"
	"github.com/pspnode/pspnode/internal/wire"
)

// Exchange is an exchange as the node drives it: gossip (gossip.go) or
// epidemic (epidemic.go). The node calls these methods and never asks
// which exchange it runs: each implementation owns what it sends and
// receives, the updates it holds before the node's first step, its bound
// on what it receives (the norm bound, the distance bound) and what it
// counts. What only gossip has, its topic, is gossip's own (TopicOf).
//
// Models and updates travel as float32, and an exchange takes and gives
// float32 vectors only: a task whose parameters are float64 (the built-in
// Go tasks) is converted at the node's side (node.Run).
type Exchange interface {
	// Push hands the exchange what the node made at step, which it has
	// just counted or taken: under gossip the step's delta, which it
	// publishes; under epidemic the node's model after the step, which
	// becomes the node's model (the base of its averages and the model it
	// sends) and goes to S peers (Kind.Averages says which). v nil: the
	// node is at step with nothing to send (its task made no update, or
	// it took the step without computing it: a checkpoint's, or the job's
	// on joining). v has the model's length and finite values within
	// MaxAbsValue (under gossip a value beyond is sent clamped, the rest
	// later). v must stay as it is until copied (if not nil) is called,
	// once, when Push has copied it (into the node's model, or the
	// message), before the sending. Pushes come in step order.
	Push(ctx context.Context, step int64, v []float32, copied func())
	// Merge averages the models received since the last merge into x,
	// the node's model (the model's length), in place, and into the
	// exchange's, and returns how many it averaged (0: x is as it was).
	// With step < 0, x is the model as the last Push gave it; with step
	// >= 0, x is the model after step, not pushed: Merge takes it in the
	// same pass, as Push would, and the average goes to peers. Under
	// gossip, where updates reach the model as they arrive, it does
	// nothing and returns 0.
	Merge(step int64, x []float32) int
	// Restart tells the exchange that the node took params, the job's
	// model, in place of its own (nil: the program's own, at its next
	// push): what it held for the old model goes.
	Restart(params []float32)
	// ReadModel copies the values [lo, hi) of the node's model as the
	// exchange holds it (epidemic: after the last step and average) into
	// dst; false when it holds none (gossip, or before the first step).
	ReadModel(lo, hi int, dst []float32) bool
	// Serve takes in one model a peer sends over the exchange protocol
	// (its stream handler): every node with a model serves it, under
	// gossip only to refuse epidemic peers' models with a clear reason.
	Serve(s network.Stream)
	// Stats counts what the exchange did (the psp_exchange_* metrics).
	Stats() Stats
	// Close waits for the sends in flight (Deps.Life has ended, so they
	// are ending) and leaves the topic.
	Close() error
}

// TopicOf is the gossip topic of ex, nil for an exchange without one:
// what only the gossip exchange has (its mesh, its subscribers, its
// counts) is reached through it.
func TopicOf(ex Exchange) *gossip.Gossip {
	if g, ok := ex.(*gossipExchange); ok {
		return g.gs
	}
	return nil
}

// A Model is the model an exchange moves: a node's task.
type Model interface {
	NumParams() int
	ModelID() uint32
	// Apply adds a received update (gossip), made at step (-1: not
	// known). The slice is reused after Apply returns.
	Apply(update []float32, step int64) error
}

// A Node is what an exchange asks of its node.
type Node interface {
	// Step is the number of steps the node has completed.
	Step() int64
	// Sample draws up to k peers uniformly (the barrier's sampler),
	// within ctx.
	Sample(ctx context.Context, k int) []peer.ID
	// Heard says that a peer's update or model of step was taken in: it
	// counts as the peer's answer at the barrier, and may let it pass.
	Heard(from peer.ID, step int64)
	// OtherLineage reports whether from was last heard, lately, on
	// another lineage of the job: its work is dropped (and counted).
	OtherLineage(from peer.ID) bool
	// PeerCount is how many peers the node knows; Population its estimate
	// of the job's size (0 for none).
	PeerCount() int
	Population() float64
}

// Counters are the node's own metrics an exchange adds to (nil: not
// counted).
type Counters struct {
	Applied       prometheus.Counter  // received updates applied (psp_updates_applied_total)
	ApplyRejected prometheus.Counter  // received updates the model refused
	NormRefused   prometheus.Counter  // received updates refused by the norm bound
	Staleness     prometheus.Observer // the node's steps minus the sender's, per model averaged (epidemic; a gossip update's goes to the Model with it)
}

// Deps are what an exchange runs with.
type Deps struct {
	Host  host.Host
	Job   string
	Model Model
	Node  Node
	// Gossip is the update topic's configuration (the gossip exchange's):
	// its Job, ParamCount, ModelID, limits and Handler are filled in.
	Gossip gossip.Config
	// Life ends when the node shuts down: the sends in flight end with
	// it. SendTimeout bounds one send.
	Life        context.Context
	SendTimeout time.Duration
	Log         *slog.Logger
	Registry    prometheus.Registerer
	Counters    Counters
	// Faults make the exchange misbehave (Poison) or lose what it is sent
	// (Lost, drawn per message under faults.Loss), for testnets.
	Faults faults.Node
	Lost   func() bool
}

// New builds the exchange of cfg for the node of d, which has a model:
// under gossip it joins the job's update topic.
func New(ctx context.Context, cfg Config, d Deps) (Exchange, error) {
	if cfg.Fragments > 1 && cfg.Fragments > d.Model.NumParams() {
		return nil, fmt.Errorf("exchange %s: %d fragments of a model of %d parameters: want at most one a parameter", cfg.Spec, cfg.Fragments, d.Model.NumParams())
	}
	b := &base{d: d, cfg: cfg, m: newMetrics(d.Registry)}
	if cfg.Kind == Epidemic {
		return newEpidemic(b), nil
	}
	return joinGossip(ctx, b)
}

// base is what both exchanges share: their deps, configuration and
// metrics, and the sending and serving of the exchange protocol
// (send.go).
type base struct {
	d        Deps
	cfg      Config
	m        *metrics
	warnings warnings
	server   *wire.ExchangeServer
}

// serveWith sets up the exchange protocol's server with j as its judge.
func (b *base) serveWith(j wire.ExchangeJudge) {
	b.server = &wire.ExchangeServer{Life: b.d.Life, Timeout: b.d.SendTimeout, Kind: byte(b.cfg.Kind),
		ModelID: b.d.Model.ModelID(), N: b.d.Model.NumParams(), Judge: j, Budget: wire.NewBlockBudget(1, 1),
		Rejected: b.m.rejected, Declined: b.m.declined, Log: b.d.Log}
}

func (b *base) Serve(s network.Stream) { b.server.Serve(s) }

// heard notes that from's update or model of step was taken in.
func (b *base) heard(from peer.ID, step int64) { b.d.Node.Heard(from, step) }

// None is the exchange of a node without a model: it sends and receives
// nothing, and refuses every model it is sent.
var None Exchange = none{}

type none struct{}

func (none) Push(_ context.Context, _ int64, _ []float32, copied func()) { done(copied) }
func (none) Merge(int64, []float32) int                                  { return 0 }
func (none) Restart([]float32)                                           {}
func (none) ReadModel(int, int, []float32) bool                          { return false }
func (none) Serve(s network.Stream)                                      { _ = s.Reset() }
func (none) Stats() Stats                                                { return Stats{} }
func (none) Close() error                                                { return nil }

// maxPerSender is how many models one sender may send a node in one
// round (between two of its averages). Only the latest counts (one vote
// per sender); the cap bounds the work a flooder makes: an honest peer
// sends a given node S/(N−1) models per step of its own, and a few more
// reach a node that waits at its barrier.
const maxPerSender = 16

// ownNorms are the L2 norms of this node's recent updates: the reference
// both exchanges bound what they receive by, which no peer can inflate.
// Its owner locks it.
type ownNorms struct{ r ring.Ring }

func newOwnNorms() ownNorms { return ownNorms{r: ring.New(32)} }

// noteNorm records nrm, the norm of an update this node computed, unless
// it is zero or not finite; it reports whether it did.
func (o *ownNorms) noteNorm(nrm float64) bool {
	if !(nrm > 0) || math.IsInf(nrm, 0) {
		return false
	}
	o.r.Add(nrm)
	return true
}

// reference is the norm received updates and models are bounded by: the
// upper quartile (nearest rank) of the recorded norms, so that the bound
// follows the node's steps as they shrink early in training without
// refusing a peer's update of a step or two before (the median did, a few
// dozen times a run), while one outlier step of its own does not lift
// it; ok is false before the first.
func (o *ownNorms) reference() (m float64, ok bool) {
	norms := o.r.Values()
	if len(norms) == 0 {
		return 0, false
	}
	slices.Sort(norms)
	return norms[(3*len(norms)+3)/4-1], true
}

// median is the median of the recorded norms; ok is false before the
// first.
func (o *ownNorms) median() (m float64, ok bool) {
	norms := o.r.Values()
	if len(norms) == 0 {
		return 0, false
	}
	slices.Sort(norms)
	return norms[len(norms)/2], true
}

// maxHeldBytes caps what a node holds before its first step.
const maxHeldBytes = 8 << 20

// heldVecs are the updates the gossip exchange received before the
// node's first step, held until it has a reference to judge them by. Its
// owner locks it.
type heldVecs struct {
	vs    [][]float32
	bytes int
}

// hold keeps v unless that would take the held vectors beyond
// maxHeldBytes; it reports whether it did.
func (h *heldVecs) hold(v []float32) bool {
	if h.bytes+4*len(v) > maxHeldBytes {
		return false
	}
	h.vs = append(h.vs, v)
	h.bytes += 4 * len(v)
	return true
}

// take returns the held vectors and holds none from then on.
func (h *heldVecs) take() [][]float32 {
	vs := h.vs
	h.vs, h.bytes = nil, 0
	return vs
}

// done calls f if it is not nil.
func done(f func()) {
	if f != nil {
		f()
	}
}
