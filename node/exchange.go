package node

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/pspnode/pspnode/gossip"
)

// The exchange is how the nodes of a job combine their work.
//
// Gossip, the default, is additive: after each step a node publishes its
// delta on the job's GossipSub topic and every node adds every other
// node's delta to its model (updates.go). A node's traffic and CPU for
// updates grow with N: it receives N−1 updates per round, times GossipSub's
// amplification.
//
// Epidemic is Epidemic Learning (M. de Vos, S. Farhadkhani, R. Guerraoui,
// A.-M. Kermarrec, R. Pires, R. Sharma, "Epidemic Learning: Boosting
// Decentralized Learning with Randomized Communication", NeurIPS 2023):
// after each local step a node sends its model to S peers drawn uniformly
// at random, afresh every round, and a node replaces its model by the
// average of its own and the models it received in the round. A node
// receives S models per round on average, whatever N: its traffic is
// constant in N. The peers come from the sampler the barrier draws from
// (Overlay.Sample), which is the paper's EL-Local variant (each node
// samples from its own view of the network).
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
// at the schedule's η unscaled, as Epidemic Learning and D-PSGD do; scaling
// by 1/N̂ would slow training N-fold.

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

// maxExchangeS bounds S: a node sends S models per step.
const maxExchangeS = 1024

// Exchange reasons a received model is refused, beside gossip's (see
// gossip.Reason): the sender runs another exchange; the model is too far
// from this node's (the norm bound's counterpart); the sender sent more
// models since this node's last step than maxPerSender.
const (
	ReasonExchangeMismatch gossip.Reason = "exchange_mismatch"
	ReasonDistance         gossip.Reason = "distance"
	ReasonRate             gossip.Reason = "rate"
)

// maxPerSender is how many models one sender may contribute to one
// average. An honest peer sends a given node S/(N−1) models per step of
// its own; a few more reach a straggler. A flooder's extra models are
// refused, so it cannot outweigh the rest.
const maxPerSender = 4

// epidemic is the state of an epidemic node's exchange.
type epidemic struct {
	s   int
	enc gossip.Encoding
	lim gossip.Limits

	mu        sync.Mutex
	sum       []float64       // Σ of the models received since the last average
	spare     []float64       // the other buffer, swapped with sum at each average
	k         int             // how many models sum holds
	from      map[peer.ID]int // models per sender in sum
	ref       []float64       // this node's model after its last step: the distance reference
	held      [][]float64     // models received before this node's first step
	heldBytes int

	// sends bounds the sends in flight; wg waits for them at Close.
	// sendMu orders starting a send against waitSends: once closed is set
	// no send starts, so wg.Wait never runs beside a wg.Go.
	sends  chan struct{}
	wg     sync.WaitGroup
	sendMu sync.Mutex
	closed bool
}

func newEpidemic(cfg Config, params int, modelID uint32) (*epidemic, error) {
	enc := cfg.Gossip.Encoding
	if enc == 0 {
		enc = gossip.EncodingDense32
	}
	if enc != gossip.EncodingDense32 {
		// Sparse encodings carry deltas, not models; float16 would round
		// away every change smaller than about 1e-3 of a parameter (gossip's
		// float16 keeps the residual for the next delta; a whole model has
		// no next delta to carry it).
		return nil, fmt.Errorf("exchange %s sends whole models: encoding %s does not carry one faithfully; use dense32", cfg.Exchange, enc)
	}
	maxAbs := cfg.Gossip.MaxAbsValue
	if !(maxAbs > 0) {
		maxAbs = gossip.DefaultConfig().MaxAbsValue
	}
	ahead := cfg.Gossip.MaxStepAhead
	return &epidemic{
		s:   cfg.Exchange.S,
		enc: enc,
		lim: gossip.Limits{
			MaxMessageSize: gossip.MaxEncodedSize(params),
			ParamCount:     params,
			ModelID:        modelID,
			MaxAbsValue:    maxAbs,
			MaxStepAhead:   ahead,
		},
		sum:   make([]float64, params),
		spare: make([]float64, params),
		from:  make(map[peer.ID]int),
		sends: make(chan struct{}, 2*cfg.Exchange.S),
	}, nil
}

// lrPopulation is the population the learning rate is scaled by (see the
// comment at the top): the estimate under gossip, 1 under epidemic.
func (n *Node) lrPopulation() float64 {
	if n.ex != nil {
		return 1
	}
	return n.population()
}

// mergeReceived replaces the model by the average of itself and the models
// received since the last call (Epidemic Learning's aggregation). Only the
// Run goroutine calls it, between steps, so nothing else writes the model
// meanwhile (an epidemic node applies no gossip updates).
func (n *Node) mergeReceived() {
	ex := n.ex
	if ex == nil {
		return
	}
	ex.mu.Lock()
	k := ex.k
	if k == 0 {
		clear(ex.from) // a new round: every sender's share starts again
		ex.mu.Unlock()
		return
	}
	sum := ex.sum
	ex.sum, ex.spare = ex.spare, nil // spare is back once this average is done
	ex.k = 0
	clear(ex.from)
	ex.mu.Unlock()

	p := n.task.Params()
	w := 1 / float64(1+k)
	for i := range p {
		p[i] = (p[i] + sum[i]) * w
	}
	if err := n.task.SetParams(p); err != nil {
		n.m.applyRejected.Inc()
		n.log.Warn("averaging received models failed; keeping this node's model", "models", k, "err", err)
	} else {
		n.xm.merged.Add(float64(k))
		n.xm.merges.Inc()
	}
	clear(sum)
	ex.mu.Lock()
	ex.spare = sum
	ex.mu.Unlock()
}

// sendModel sends the node's model after step to S peers drawn from the
// barrier's sampler, in the background (exchangeproto.go), and keeps it as
// the reference received models are measured against.
func (n *Node) sendModel(step int64) {
	ex := n.ex
	params := n.task.Params()
	ex.mu.Lock()
	ex.ref = params
	ex.mu.Unlock()

	var payload []byte
	if poison := n.cfg.faults.Poison; poison != nil {
		if payload = poison(step, params); payload == nil {
			return
		}
	} else {
		u := &gossip.Update{Sender: n.h.ID(), Step: step, ModelID: ex.lim.ModelID, ParamCount: len(params), Encoding: ex.enc,
			Values: make([]float32, len(params))}
		for i, v := range params {
			if !(math.Abs(v) <= ex.lim.MaxAbsValue) { // NaN too
				n.xm.sendFailed.WithLabelValues(sendInvalid).Inc()
				n.log.Warn("model not sent: a parameter is not finite or exceeds MaxAbsValue", "step", step, "index", i, "value", v)
				return
			}
			u.Values[i] = float32(v) // to float16, if so encoded, by EncodeUpdate
		}
		var err error
		if payload, err = gossip.EncodeUpdate(nil, u); err != nil {
			n.xm.sendFailed.WithLabelValues(sendInvalid).Inc()
			n.log.Warn("model not sent", "step", step, "err", err)
			return
		}
	}
	body := marshalExchange(payload)
	ex.sendMu.Lock()
	defer ex.sendMu.Unlock()
	if ex.closed {
		return
	}
	for _, p := range n.sample(n.life, ex.s) {
		select {
		case ex.sends <- struct{}{}:
		default:
			// As many sends as two rounds' worth are still in flight:
			// the peers are slower than this node's steps. Skip rather
			// than queue.
			n.xm.sendFailed.WithLabelValues(sendSkipped).Inc()
			continue
		}
		ex.wg.Go(func() { // ends within 10 × QueryTimeout, or when the node closes
			defer func() { <-ex.sends }()
			n.sendTo(p, step, body)
		})
	}
}

// offer takes in a validated model y from peer from: held before this
// node's first step, refused if too far from this node's model or if from
// has sent too many since the last average, else added to the sum. It
// returns the reason for a refusal ("" when taken or held).
func (n *Node) offer(from peer.ID, y []float64) gossip.Reason {
	ex := n.ex
	bound, ok := n.distanceBound()
	ex.mu.Lock()
	defer ex.mu.Unlock()
	if ex.from[from] >= maxPerSender {
		return ReasonRate
	}
	if !ok {
		// No own step yet: no reference. Hold (bounded), and judge the
		// models after the first step (releaseHeld).
		if ex.heldBytes+8*len(y) > maxHeldBytes {
			return ReasonRate
		}
		ex.held = append(ex.held, y)
		ex.heldBytes += 8 * len(y)
		ex.from[from]++
		return ""
	}
	return ex.takeLocked(from, y, bound)
}

// takeLocked adds y to the sum if it is within bound of the reference
// (bound 0: no check). ex.mu is held.
func (ex *epidemic) takeLocked(from peer.ID, y []float64, bound float64) gossip.Reason {
	if bound > 0 && ex.ref != nil && dist(y, ex.ref) > bound {
		return ReasonDistance
	}
	for i, v := range y {
		ex.sum[i] += v
	}
	ex.k++
	ex.from[from]++
	return ""
}

// releaseHeld judges the models held before the node's first step, now
// that it has a reference.
func (n *Node) releaseHeld() {
	ex := n.ex
	bound, ok := n.distanceBound()
	if !ok {
		return
	}
	ex.mu.Lock()
	held := ex.held
	ex.held, ex.heldBytes = nil, 0
	var refused int
	for _, y := range held {
		// Held models were counted in from when held; count them once.
		if ex.ref != nil && bound > 0 && dist(y, ex.ref) > bound {
			refused++
			continue
		}
		for i, v := range y {
			ex.sum[i] += v
		}
		ex.k++
	}
	ex.mu.Unlock()
	if refused > 0 {
		n.xm.rejected.WithLabelValues(string(ReasonDistance)).Add(float64(refused))
	}
}

// distanceBound is the norm bound's counterpart for models: a received
// model is refused if its distance to this node's model exceeds
// NormBound × (1 + S) × the median norm of this node's own recent steps.
// Averaged with k ≈ S others, a model at that distance moves this node's
// model by about NormBound of its own steps: the most one gossip update
// may (updates.go). Honest peers' models differ from ours by the
// consensus distance and the steps they are ahead or behind, a few steps'
// worth. ok is false until the node has made a step; bound is 0 when the
// check is off (NormBound 0).
func (n *Node) distanceBound() (bound float64, ok bool) {
	if n.cfg.NormBound <= 0 {
		return 0, true
	}
	n.normMu.Lock()
	norms := n.ownNorms.values()
	n.normMu.Unlock()
	if len(norms) == 0 {
		return 0, false
	}
	slices.Sort(norms)
	return n.cfg.NormBound * float64(1+n.ex.s) * norms[len(norms)/2], true
}

func dist(a, b []float64) float64 {
	var s float64
	for i, x := range a {
		d := x - b[i]
		s += d * d
	}
	return math.Sqrt(s)
}

// waitSends waits for the sends in flight; n.life has ended, so they are
// ending.
func (n *Node) waitSends() {
	if n.ex != nil {
		n.ex.sendMu.Lock()
		n.ex.closed = true
		n.ex.sendMu.Unlock()
		n.ex.wg.Wait()
	}
}
