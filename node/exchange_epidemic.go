package node

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/pspnode/pspnode/gossip"
)

// epidemic is the epidemic exchange, Epidemic Learning (see the comment at
// the top of exchange.go): after each step the node's model goes to S
// sampled peers over the exchange protocol (exchangeproto.go), and before
// each step the node averages its model with the models received since.
type epidemic struct {
	n    *Node
	self peer.ID // the sender of this node's models
	s    int
	lim  gossip.Limits

	normMu sync.Mutex
	norms  ownNorms // this node's recent updates: the distance bound's reference

	mu    sync.Mutex
	sum   []float64       // Σ of the models received since the last average
	spare []float64       // the other buffer, swapped with sum at each average
	k     int             // how many models sum holds
	from  map[peer.ID]int // models per sender in sum
	steps []int64         // the senders' steps of the models in sum
	ref   []float64       // this node's model after its last step: the distance reference
	held  heldVecs        // models received before this node's first step

	// sends bounds the sends in flight; wg waits for them at close.
	// sendMu orders starting a send against close: once closed is set
	// no send starts, so wg.Wait never runs beside a wg.Go.
	sends  chan struct{}
	wg     sync.WaitGroup
	sendMu sync.Mutex
	closed bool
}

// newEpidemic is n's epidemic exchange, whose peer ID is self, for a model
// of params parameters whose architecture is modelID.
func newEpidemic(n *Node, self peer.ID, params int, modelID uint32) (*epidemic, error) {
	cfg := n.cfg
	if enc := cfg.Gossip.Encoding; enc != 0 && enc != gossip.EncodingDense32 {
		// Sparse encodings carry deltas, not models; float16 would round
		// away every change smaller than about 1e-3 of a parameter (gossip's
		// float16 keeps the residual for the next delta; a whole model has
		// no next delta to carry it).
		return nil, fmt.Errorf("exchange %s sends whole models: encoding %s does not carry one faithfully; use dense32, or the gossip exchange", cfg.Exchange, enc)
	}
	maxAbs := cfg.Gossip.MaxAbsValue
	if !(maxAbs > 0) {
		maxAbs = gossip.DefaultConfig().MaxAbsValue
	}
	return &epidemic{
		n:    n,
		self: self,
		s:    cfg.Exchange.S,
		lim: gossip.Limits{
			MaxMessageSize: gossip.MaxEncodedSize(params),
			ParamCount:     params,
			ModelID:        modelID,
			MaxAbsValue:    maxAbs,
			MaxStepAhead:   cfg.Gossip.MaxStepAhead,
		},
		norms: newOwnNorms(),
		sum:   make([]float64, params),
		spare: make([]float64, params),
		from:  make(map[peer.ID]int),
		sends: make(chan struct{}, 2*cfg.Exchange.S),
	}, nil
}

// push sends the node's model to S peers; upd, the step's delta, is the
// distance bound's reference. The first push judges the models held
// until then.
func (e *epidemic) push(_ context.Context, step int64, upd []float64) {
	if upd != nil {
		e.normMu.Lock()
		e.norms.note(upd)
		e.normMu.Unlock()
	}
	e.sendModel(step)
	e.releaseHeld()
}

// merge replaces the model by the average of itself and the models
// received since the last call (Epidemic Learning's aggregation). Only the
// stepping goroutine calls it, between steps, so nothing else writes the
// model meanwhile (an epidemic node applies no gossip updates).
func (e *epidemic) merge() {
	n := e.n
	e.mu.Lock()
	k := e.k
	if k == 0 {
		clear(e.from) // a new round: every sender's share starts again
		e.mu.Unlock()
		return
	}
	sum := e.sum
	e.sum, e.spare = e.spare, nil // spare is back once this average is done
	e.k = 0
	clear(e.from)
	now := n.step.Load()
	for _, st := range e.steps {
		n.m.staleness.Observe(float64(now - st))
	}
	e.steps = e.steps[:0]
	e.mu.Unlock()

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
	e.mu.Lock()
	e.spare = sum
	e.mu.Unlock()
}

// setStep does nothing: a model carries its sender's step, and a received
// one is judged against the node's step as it is then.
func (e *epidemic) setStep(int64) {}

// scalesLR: averaging does not add, so the rate is the schedule's.
func (e *epidemic) scalesLR() bool { return false }

// waitMesh and waitSubscribed do nothing: models go to peers sampled when
// they are sent, over streams of their own.
func (e *epidemic) waitMesh(context.Context)       {}
func (e *epidemic) waitSubscribed(context.Context) {}

func (e *epidemic) topic() *gossip.Gossip     { return nil }
func (e *epidemic) topicPayloadBytes() uint64 { return 0 }

// stats are the models sent (one per peer) and taken, and the refused ones
// by reason.
func (e *epidemic) stats() gossip.Stats {
	st := gossip.Stats{Rejected: map[gossip.Reason]uint64{}}
	x := e.n.ExchangeStats()
	st.Sent, st.SentBytes, st.Received, st.ReceivedBytes = x.Sent, x.SentBytes, x.Received, x.ReceivedBytes
	for r, c := range x.Rejected {
		st.Rejected[gossip.Reason(r)] = c
	}
	return st
}

// close waits for the sends in flight; n.life has ended, so they are
// ending.
func (e *epidemic) close() error {
	e.sendMu.Lock()
	e.closed = true
	e.sendMu.Unlock()
	e.wg.Wait()
	return nil
}

// sendModel sends the node's model after step to S peers drawn from the
// barrier's sampler, in the background (exchangeproto.go), and keeps it as
// the reference received models are measured against.
func (e *epidemic) sendModel(step int64) {
	n := e.n
	req, ok := e.snapshot(step)
	if !ok {
		return
	}
	e.sendMu.Lock()
	defer e.sendMu.Unlock()
	if e.closed {
		return
	}
	for _, p := range n.sample(n.life, e.s) {
		select {
		case e.sends <- struct{}{}:
		default:
			// As many sends as two rounds' worth are still in flight:
			// the peers are slower than this node's steps. Skip rather
			// than queue.
			n.xm.sendFailed.WithLabelValues(sendSkipped).Inc()
			continue
		}
		e.wg.Go(func() { // ends within 10 × QueryTimeout, or when the node closes
			defer func() { <-e.sends }()
			n.sendTo(p, step, req)
		})
	}
}

// snapshot reads the model after step once, keeps it as the distance
// reference, and encodes it once into the request every peer's stream
// carries: two copies of the model, however many peers it goes to.
func (e *epidemic) snapshot(step int64) (exchangeRequest, bool) {
	params := e.n.task.Params()
	e.mu.Lock()
	e.ref = params
	e.mu.Unlock()
	return e.request(step, params)
}

// request is the exchange request that carries params, the node's model
// after step (or, for a node playing a poisoner, what faults.Poison makes
// of it). ok is false when there is nothing to send.
func (e *epidemic) request(step int64, params []float64) (req exchangeRequest, ok bool) {
	n := e.n
	if poison := n.cfg.faults.Poison; poison != nil {
		payload := poison(step, params)
		if payload == nil {
			return exchangeRequest{}, false
		}
		return endRequest(append(startRequest(len(payload)), payload...)), true
	}
	for i, v := range params {
		if !(math.Abs(v) <= e.lim.MaxAbsValue) { // NaN too
			n.xm.sendFailed.WithLabelValues(sendInvalid).Inc()
			n.log.Warn("model not sent: a parameter is not finite or exceeds MaxAbsValue", "step", step, "index", i, "value", v)
			return exchangeRequest{}, false
		}
	}
	b, err := gossip.AppendDense(startRequest(gossip.MaxEncodedSize(len(params))), e.self, step, e.lim.ModelID, params)
	if err != nil {
		n.xm.sendFailed.WithLabelValues(sendInvalid).Inc()
		n.log.Warn("model not sent", "step", step, "err", err)
		return exchangeRequest{}, false
	}
	return endRequest(b), true
}

// screen says, from a request's header alone, whether this node refuses
// the model that follows: the sender runs another exchange, or has sent
// its share since this node's last step.
func (e *epidemic) screen(from peer.ID, kind ExchangeKind) gossip.Reason {
	if kind != ExchangeEpidemic {
		return e.n.otherExchange(from, kind)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.from[from] >= maxPerSender {
		return ReasonRate
	}
	return ""
}

// accept checks a received model's payload once its header passed
// screen: validation, the distance bound, the average.
func (e *epidemic) accept(from peer.ID, payload []byte) gossip.Reason {
	n := e.n
	if n.cfg.faults.Loss > 0 && n.lost() {
		return ""
	}
	if n.lin.fromOther(from, time.Now()) {
		n.lin.otherUpdates.Inc() // a model of another lineage of the job (genesis.go)
		return ReasonOtherLineage
	}
	u, err := gossip.Validate(payload, from, n.step.Load(), e.lim)
	if err != nil {
		n.log.Debug("model refused", "from", from, "err", err)
		return gossip.ReasonOf(err)
	}
	if r := e.offer(from, u.Step, u.Dense()); r != "" {
		n.log.Debug("model refused", "from", from, "step", u.Step, "reason", string(r))
		return r
	}
	n.xm.received.Inc()
	n.xm.receivedBytes.Add(float64(len(payload)))
	n.progress.saw(from, u.Step)
	if u.Step <= n.step.Load() {
		n.poke() // a peer at or behind us progressed: a waiting barrier may pass now
	}
	return ""
}

// offer takes in a validated model y from peer from: held before this
// node's first step, refused if too far from this node's model or if from
// has sent too many since the last average, else added to the sum. It
// returns the reason for a refusal ("" when taken or held).
func (e *epidemic) offer(from peer.ID, step int64, y []float64) gossip.Reason {
	bound, ok := e.distanceBound()
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.from[from] >= maxPerSender {
		return ReasonRate
	}
	if !ok {
		// No own step yet: no reference. Hold (bounded), and judge the
		// models after the first step (releaseHeld).
		if !e.held.hold(y) {
			return ReasonRate
		}
		e.from[from]++
		return ""
	}
	if bound > 0 && e.ref != nil && dist(y, e.ref) > bound {
		return ReasonDistance
	}
	e.addLocked(y)
	e.steps = append(e.steps, step)
	e.from[from]++
	return ""
}

// addLocked adds y to the sum. e.mu is held.
func (e *epidemic) addLocked(y []float64) {
	for i, v := range y {
		e.sum[i] += v
	}
	e.k++
}

// releaseHeld judges the models held before the node's first step, now
// that it has a reference.
func (e *epidemic) releaseHeld() {
	bound, ok := e.distanceBound()
	if !ok {
		return
	}
	e.mu.Lock()
	var refused int
	for _, y := range e.held.take() {
		// Held models were counted in from when held; count them once.
		if e.ref != nil && bound > 0 && dist(y, e.ref) > bound {
			refused++
			continue
		}
		e.addLocked(y)
	}
	e.mu.Unlock()
	if refused > 0 {
		e.n.xm.rejected.WithLabelValues(string(ReasonDistance)).Add(float64(refused))
	}
}

// distanceBound is the norm bound's counterpart for models: a received
// model is refused if its distance to this node's model exceeds
// NormBound × (1 + S) × the median norm of this node's own recent steps.
// Averaged with k ≈ S others, a model at that distance moves this node's
// model by about NormBound of its own steps: the most one gossip update
// may (exchange_gossip.go). Honest peers' models differ from ours by the
// consensus distance and the steps they are ahead or behind, a few steps'
// worth. ok is false until the node has made a step; bound is 0 when the
// check is off (NormBound 0).
func (e *epidemic) distanceBound() (bound float64, ok bool) {
	nb := e.n.cfg.NormBound
	if nb <= 0 {
		return 0, true
	}
	e.normMu.Lock()
	med, ok := e.norms.median()
	e.normMu.Unlock()
	if !ok {
		return 0, false
	}
	return nb * float64(1+e.s) * med, true
}
