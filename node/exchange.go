package node

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/pspnode/pspnode/gossip"
	"github.com/pspnode/pspnode/internal/wire"
)

// The exchange is how the nodes of a job combine their work.
//
// Gossip (the zero Exchange) is additive: after each step a node publishes
// its delta on the job's GossipSub topic and every node adds every other
// node's delta to its model (exchange_gossip.go). A node's traffic and CPU
// for updates grow with N: it receives N−1 updates per round, times
// GossipSub's amplification.
//
// Epidemic (DefaultConfig's, epidemic:4) is Epidemic Learning (M. de Vos,
// S. Farhadkhani, R. Guerraoui, A.-M. Kermarrec, R. Pires, R. Sharma,
// "Epidemic Learning: Boosting Decentralized Learning with Randomized
// Communication", NeurIPS 2023): after each local step a node sends its
// model to S peers drawn uniformly at random, afresh every round, and a
// node replaces its model by the average of its own and the models it
// received in the round. A node receives S models per round on average,
// whatever N: its traffic is constant in N. The peers come from the
// sampler the barrier draws from (Overlay.Sample), which is the paper's
// EL-Local variant (each node samples from its own view of the network).
//
// Rounds here are not synchronous: a node averages, before each step, the
// models that arrived since its last step (a straggler gets more of them
// and is pulled to its peers' models harder), then steps and sends. The
// sum of what arrived is kept, not the models, so a node holds one extra
// parameter vector however many arrive.
//
// Learning rate. Under gossip every node adds every update, so N nodes
// stepping at rate η move every model by N steps' worth; a node scales its
// rate by 1/N̂ (Config.ScaleLR) so that a round moves the models by one
// step of the mean gradient. Averaging does not add: if every node steps
// at η and then models are averaged, the mean model moves by η times the
// mean of the nodes' gradients, one step of the mean gradient, the same
// progress as gossip's per round, already. So under epidemic nodes train
// at the schedule's η unscaled, as Epidemic Learning and D-PSGD do;
// scaling by 1/N̂ would slow training N-fold.

// ExchangeKind names an exchange.
type ExchangeKind uint8

// The exchanges.
const (
	ExchangeGossip   ExchangeKind = 0 // every delta to every node over GossipSub
	ExchangeEpidemic ExchangeKind = 1 // each model to S sampled peers, averaged
)

// Exchange is how a node combines its work with its peers'. The zero value
// is gossip. All nodes of a job must use the same kind (S may differ).
type Exchange struct {
	Kind ExchangeKind
	// S is how many peers an epidemic node sends its model to after each
	// step (at least 1).
	S int
}

// String renders the exchange as ParseExchange reads it.
func (e Exchange) String() string {
	if e.Kind == ExchangeEpidemic {
		return "epidemic:" + strconv.Itoa(e.S)
	}
	return "gossip"
}

// ParseExchange reads "gossip" or "epidemic:S" (S a whole number >= 1).
func ParseExchange(s string) (Exchange, error) {
	if s == "gossip" {
		return Exchange{}, nil
	}
	if rest, ok := strings.CutPrefix(s, "epidemic:"); ok {
		v, err := strconv.Atoi(rest)
		if err != nil || v < 1 {
			return Exchange{}, fmt.Errorf("%q: S must be a whole number >= 1 (peers each model goes to), e.g. epidemic:4", s)
		}
		return Exchange{Kind: ExchangeEpidemic, S: v}, nil
	}
	return Exchange{}, fmt.Errorf("%q: want gossip or epidemic:S, e.g. epidemic:4", s)
}

// Set implements flag.Value.
func (e *Exchange) Set(s string) error {
	v, err := ParseExchange(s)
	if err != nil {
		return err
	}
	*e = v
	return nil
}

func (e Exchange) validate() error {
	switch {
	case e.Kind == ExchangeGossip && e.S == 0:
	case e.Kind == ExchangeEpidemic && e.S >= 1 && e.S <= maxExchangeS:
	default:
		return fmt.Errorf("Exchange %s (kind %d, S %d): want gossip or epidemic:S with 1 <= S <= %d", e, e.Kind, e.S, maxExchangeS)
	}
	return nil
}

// validateGossip checks g, the gossip topic's configuration for job, if
// the exchange is gossip: an epidemic node has no topic (of g it uses
// only the encoding, which newEpidemic checks, MaxAbsValue and
// MaxStepAhead).
func (e Exchange) validateGossip(g gossip.Config, job string) error {
	if e.Kind == ExchangeEpidemic {
		return nil
	}
	g.Job, g.ParamCount = job, 1
	return g.Validate()
}

// maxExchangeS bounds S: a node sends S models per step.
const maxExchangeS = 1024

// maxPerSender is how many models one sender may send a node in one
// round (between two of its averages). Only the latest counts (one vote
// per sender); the cap bounds the work a flooder makes: an honest peer
// sends a given node S/(N−1) models per step of its own, and a few more
// reach a node that waits at its barrier.
const maxPerSender = 16

// exchanger is an exchange as the node drives it: gossip
// (exchange_gossip.go) or epidemic (exchange_epidemic.go). The node calls
// these methods and never asks which exchange it runs: each implementation
// owns what it sends and receives, the updates it holds before the node's
// first step, its bound on what it receives (the norm bound, the distance
// bound) and what it counts.
type exchanger interface {
	// push hands the exchange the update of step, which the node has just
	// counted (upd nil: the task made none). Run or the Driver calls it
	// after each step, in step order.
	push(ctx context.Context, step int64, upd []float64)
	// push32 is push for a driven node's float32 vector, which its caller
	// has checked (finite, within MaxAbsValue): under gossip the step's
	// delta, under epidemic the model after the step. v must stay as it
	// is until copied is called (if not nil): once, when push32 has copied
	// it (into the node's model, or the message), before the sending.
	push32(ctx context.Context, step int64, v []float32, copied func())
	// merge folds into the model what arrived since the last call. The
	// stepping goroutine calls it before each step.
	merge()
	// merge32 is merge for a driven node: it writes the change the
	// average makes into delta and returns how many models it averaged
	// (epidemic); under gossip, where updates go to the task as they
	// arrive, it returns 0.
	merge32(delta []float32) int
	// setStep tells the exchange a step the node took without computing
	// it (from a checkpoint, or the job's on joining).
	setStep(step int64)
	// restart tells the exchange that the node took params, the job's
	// model, in place of its own (realign.go): what it held for the old
	// model goes.
	restart(params []float64)
	// model is the node's model as the exchange holds it (epidemic: after
	// the last step and average), nil when it holds none (gossip).
	model() []float64
	// scalesLR says whether the learning rate is scaled by 1/N̂ (see the
	// comment at the top).
	scalesLR() bool
	// waitMesh waits, within ctx, until what push sends reaches peers;
	// Run calls it before its first step.
	waitMesh(ctx context.Context)
	// waitSubscribed waits, up to a bound, until a known peer receives
	// what push sends; the Driver calls it when a trainer begins.
	waitSubscribed(ctx context.Context)
	// screen and accept judge a request of the exchange protocol
	// (wire.ExchangeServer): screen from its header alone, accept its
	// payload once screen passed it. Each returns the reason for a
	// refusal, "" when the model is taken.
	screen(from peer.ID, kind ExchangeKind) gossip.Reason
	accept(from peer.ID, payload []byte) gossip.Reason
	// stats counts the updates exchanged (Node.UpdateStats).
	stats() gossip.Stats
	// topic is the gossip topic, nil for an exchange without one.
	topic() *gossip.Gossip
	// topicPayloadBytes is the update payload the gossip topic delivered
	// (0 without a topic), for the gossip amplification (traffic.go).
	topicPayloadBytes() uint64
	// close waits for the sends in flight (n.life has ended, so they are
	// ending) and leaves the topic.
	close() error
}

// newExchanger builds the exchange of n's configuration for n's model.
func (n *Node) newExchanger(ctx context.Context) (exchanger, error) {
	var ex exchanger
	var err error
	if n.cfg.Exchange.Kind == ExchangeEpidemic {
		ex, err = newEpidemic(n, n.h.ID(), n.task.NumParams(), n.task.ModelID())
	} else {
		ex, err = joinGossip(ctx, n)
	}
	if err != nil {
		return nil, err
	}
	return ex, nil
}

// exch is the node's exchange: noExchange until the model is attached
// (attachModel sets n.ex before modelUp).
func (n *Node) exch() exchanger {
	if !n.modelUp.Load() {
		return noExchange{}
	}
	return n.ex
}

// noExchange is the exchange of a node without a model: it sends and
// receives nothing.
type noExchange struct{}

func (noExchange) push(context.Context, int64, []float64)                        {}
func (noExchange) push32(_ context.Context, _ int64, _ []float32, copied func()) { done(copied) }
func (noExchange) merge()                                                        {}
func (noExchange) merge32([]float32) int                                         { return 0 }
func (noExchange) setStep(int64)                                                 {}
func (noExchange) restart([]float64)                                             {}
func (noExchange) model() []float64                                              { return nil }
func (noExchange) scalesLR() bool                                                { return true }
func (noExchange) waitMesh(context.Context)                                      {}
func (noExchange) waitSubscribed(context.Context)                                {}
func (noExchange) screen(peer.ID, ExchangeKind) gossip.Reason {
	return wire.ReasonExchangeMismatch
}
func (noExchange) accept(peer.ID, []byte) gossip.Reason { return wire.ReasonExchangeMismatch }
func (noExchange) stats() gossip.Stats {
	return gossip.Stats{Rejected: map[gossip.Reason]uint64{}}
}
func (noExchange) topic() *gossip.Gossip     { return nil }
func (noExchange) topicPayloadBytes() uint64 { return 0 }
func (noExchange) close() error              { return nil }

// lrPopulation is the population the learning rate is scaled by (see the
// comment at the top): the estimate under gossip, 1 under epidemic.
func (n *Node) lrPopulation() float64 {
	if !n.exch().scalesLR() {
		return 1
	}
	return n.population()
}

// ownNorms are the L2 norms of this node's recent updates: the reference
// both exchanges bound what they receive by, which no peer can inflate.
// Its owner locks it.
type ownNorms struct{ r ring }

func newOwnNorms() ownNorms { return ownNorms{r: newRing(32)} }

// note records the norm of delta, an update this node computed, unless it
// is zero or not finite; it reports whether it did.
func (o *ownNorms) note(delta []float64) bool { return o.noteNorm(l2(delta)) }

// noteNorm records nrm, the norm of an update this node computed, unless
// it is zero or not finite; it reports whether it did.
func (o *ownNorms) noteNorm(nrm float64) bool {
	if !(nrm > 0) || math.IsInf(nrm, 0) {
		return false
	}
	o.r.add(nrm)
	return true
}

// reference is the norm received updates and models are bounded by: the
// upper quartile (nearest rank) of the recorded norms, so that the bound
// follows the node's steps as they shrink early in training without
// refusing a peer's update of a step or two before (the median did, a few
// dozen times a run), while one outlier step of its own does not lift
// it; ok is false before the first.
func (o *ownNorms) reference() (m float64, ok bool) {
	norms := o.r.values()
	if len(norms) == 0 {
		return 0, false
	}
	slices.Sort(norms)
	return norms[(3*len(norms)+3)/4-1], true
}

// median is the median of the recorded norms; ok is false before the
// first.
func (o *ownNorms) median() (m float64, ok bool) {
	norms := o.r.values()
	if len(norms) == 0 {
		return 0, false
	}
	slices.Sort(norms)
	return norms[len(norms)/2], true
}

// maxHeldBytes caps what a node holds before its first step.
const maxHeldBytes = 8 << 20

// heldVecs are the vectors (updates or models) an exchange received
// before the node's first step, held until it has a reference to judge
// them by. Its owner locks it.
type heldVecs struct {
	vs    [][]float64
	bytes int
}

// hold keeps v unless that would take the held vectors beyond
// maxHeldBytes; it reports whether it did.
func (h *heldVecs) hold(v []float64) bool {
	if h.bytes+8*len(v) > maxHeldBytes {
		return false
	}
	h.vs = append(h.vs, v)
	h.bytes += 8 * len(v)
	return true
}

// take returns the held vectors and holds none from then on.
func (h *heldVecs) take() [][]float64 {
	vs := h.vs
	h.vs, h.bytes = nil, 0
	return vs
}

func l2(v []float64) float64 {
	var s float64
	for _, x := range v {
		s += x * x
	}
	return math.Sqrt(s)
}

func dist(a, b []float64) float64 {
	var s float64
	for i, x := range a {
		d := x - b[i]
		s += d * d
	}
	return math.Sqrt(s)
}

// done calls f if it is not nil.
func done(f func()) {
	if f != nil {
		f()
	}
}
