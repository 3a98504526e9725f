package node

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/pspnode/pspnode/gossip"
	"github.com/pspnode/pspnode/internal/f32"
	"github.com/pspnode/pspnode/internal/wire"
)

// epidemic is the epidemic exchange, Epidemic Learning (see the comment at
// the top of exchange.go): after each step the node's model goes to S
// sampled peers over the exchange protocol (package wire), and before
// each step the node averages its model with the models received since.
//
// Everything here is float32, as the models travel: the node's model
// after its last step (ref, the base of averages and distances), the
// models received, and the average's change. A trainer's model crosses
// into the exchange once per step (push32, one copy) and the average goes
// back once (merge32, into the trainer's buffer); a built-in model is
// converted from its float64 parameters once per step.
//
// The average is robust to a peer that pushes models in one direction,
// round after round (self-centred clipping, after He, Karimireddy and
// Jaggi, "Byzantine-Robust Decentralized Learning via ClippedGossip",
// 2022):
//
//   - one vote per sender per average: a sender's later model in a round
//     replaces its earlier one (its freshest counts), and it may replace
//     it maxPerSender times; and a sender counts at most once in
//     (N − 1)/(4S) averages (spacingFor), about as often as an honest peer
//     that samples its S peers comes, so that peers that push to every
//     node every step cannot fill the rounds;
//   - each model's pull on this node's model, y − ref, is clipped to a
//     radius τ: clipFactor × the median distance of the models averaged
//     in recent rounds (one per sender per round), a reference a
//     minority of senders cannot move; a model farther than the distance
//     bound (distanceBound) is refused whole;
//   - the new model is ref + Σ clip(y_j − ref, τ) / (1 + k), k the
//     senders: Epidemic Learning's average when no model is clipped.
type epidemic struct {
	n    *Node
	self peer.ID
	s    int
	lim  gossip.Limits
	p    int // parameters

	mu       sync.Mutex
	ref      []float32          // the model after the last step and average; nil before the first step
	norms    ownNorms           // this node's recent step norms: the distance bound's reference
	dists    ring               // distances to ref of the models of recent averages: the clip radius's reference
	round    []*inModel         // the models of this round, one per sender
	free     [][]float32        // model buffers to reuse
	held     int                // bytes held in round before the first step
	rounds   uint64             // averages (merges) since the first step
	lastIn   map[peer.ID]uint64 // the average each sender's last model went into
	spacing  uint64             // averages between two models of one sender (spacingFor)
	scratch  []float32          // a built-in task's average change
	scratch2 []float64          // a built-in task's parameters

	// sends bounds the sends in flight; wg waits for them at close.
	// sendMu orders starting a send against close: once closed is set
	// no send starts, so wg.Wait never runs beside a wg.Go.
	sends  chan struct{}
	wg     sync.WaitGroup
	sendMu sync.Mutex
	closed bool
	// requests holds the buffers models are encoded into; a step's goes
	// back once its last send has ended.
	requests sync.Pool
}

// inModel is one sender's model in a round: the latest it sent.
type inModel struct {
	from     peer.ID
	step     int64
	v        []float32
	dist     float64 // its distance to the reference when it came; < 0: not known
	replaced int     // times a later model replaced it in this round
}

const (
	// clipFactor × the median distance of recent models is the clip
	// radius: an honest model is rarely clipped, and a sender that pushes
	// one way moves this node's model by at most about that much per
	// round, shared with the other senders.
	clipFactor = 1
	// distWindow is how many recent models' distances the radius reads.
	distWindow = 64
	// minRoundPool is the least number of senders one average takes.
	minRoundPool = 8
)

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
		p:    params,
		lim: gossip.Limits{
			MaxMessageSize: gossip.MaxEncodedSize(params),
			ParamCount:     params,
			ModelID:        modelID,
			MaxAbsValue:    maxAbs,
			MaxStepAhead:   cfg.Gossip.MaxStepAhead,
		},
		norms:   newOwnNorms(),
		dists:   newRing(distWindow),
		lastIn:  make(map[peer.ID]uint64),
		spacing: 1,
		sends:   make(chan struct{}, 2*cfg.Exchange.S),
	}, nil
}

// spacingFor is how many averages must pass before a sender's model is
// taken again, in a job of population nodes where each sends its model to
// s sampled peers: a quarter of the averages between two of an honest
// sender's models to this node, (N − 1)/s, and at least 1 (an honest
// model comes sooner, and is refused, about one time in five: in a clean
// run of 100 nodes, 18 % of the models were, and the fit was as before). A peer that samples its
// peers, as every honest one does, comes about once in (N − 1)/s of its
// steps; one that pushes to every node every step (a poisoner) would
// otherwise fill every round of every node, however few such peers there
// are: with 10 of 100 pushing, they were most of every round's senders.
func spacingFor(population float64, s int) uint64 {
	if s < 1 || !(population > 1) {
		return 1
	}
	return uint64(max(1, int((population-1)/float64(4*s))))
}

// poolSize is how many senders one average takes.
func (e *epidemic) poolSize() int { return max(minRoundPool, 2*e.s) }

// push takes the model of a built-in task after step (its float64
// parameters, converted once) as the reference and sends it to S peers;
// upd, the step's delta, is a norm of the node's own steps. The first push
// judges the models held until then.
func (e *epidemic) push(_ context.Context, step int64, upd []float64) {
	if e.refFromTask(upd) {
		e.sendModel(step)
	}
}

// refFromTask makes the built-in task's model the reference, notes upd's
// norm and judges the models held until then; false when the task has no
// model of the exchange's size.
func (e *epidemic) refFromTask(upd []float64) bool {
	params := e.n.task.Params()
	if len(params) != e.p {
		return false
	}
	e.mu.Lock()
	if e.ref == nil {
		e.ref = make([]float32, e.p)
	}
	for i, x := range params {
		e.ref[i] = float32(x)
	}
	if upd != nil {
		e.norms.note(upd)
	}
	e.releaseHeldLocked()
	e.mu.Unlock()
	return true
}

// push32 takes a trainer's model after step: it copies model (the
// caller's buffer, not kept) into the reference, notes the norm of the
// step that made it (its distance from the reference, which holds the
// model after the last step and average), and sends it to S peers. The
// first push judges the models held until then.
func (e *epidemic) push32(_ context.Context, step int64, model []float32, copied func()) {
	if len(model) != e.p {
		done(copied)
		return
	}
	e.mu.Lock()
	if e.ref == nil {
		e.ref = slices.Clone(model)
	} else {
		e.norms.noteNorm(f32.CopyDist(e.ref, model))
	}
	e.releaseHeldLocked()
	e.mu.Unlock()
	done(copied)
	e.sendModel(step)
}

// merge averages a built-in task's model with the models received since
// the last call (Epidemic Learning's aggregation, clipped). Only the
// stepping goroutine calls it, between steps, so nothing else writes the
// model meanwhile (an epidemic node applies no gossip updates).
func (e *epidemic) merge() {
	n := e.n
	if e.scratch == nil {
		e.scratch = make([]float32, e.p)
	}
	k := e.merge32(e.scratch)
	if k == 0 {
		return
	}
	e.scratch2 = n.task.Params()
	for i, d := range e.scratch {
		e.scratch2[i] += float64(d)
	}
	if err := n.task.SetParams(e.scratch2); err != nil {
		n.m.applyRejected.Inc()
		n.log.Warn("averaging received models failed; keeping this node's model", "models", k, "err", err)
	}
}

// merge32 computes the change the average of this node's model and the
// models of the round makes, into delta (NumParams values), and takes it
// into the reference; it returns how many models it averaged (0: none,
// and delta is untouched). The stepping goroutine (the trainer's call)
// calls it between steps.
func (e *epidemic) merge32(delta []float32) int {
	n := e.n
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ref == nil || len(delta) != e.p {
		return 0
	}
	e.rounds++ // every average counts, empty or not: the spacing is in this node's steps
	if len(e.round) == 0 {
		return 0
	}
	// The radius comes from this and earlier rounds' distances, one per
	// sender per round, so a sender that sends many models weighs as one.
	for _, m := range e.round {
		if m.dist < 0 {
			m.dist = f32.Dist(m.v, e.ref)
		}
		e.dists.add(m.dist)
	}
	tau := e.radiusLocked()
	k := len(e.round)
	w := 1 / float64(1+k)
	now := n.step.Load()
	clipped := 0
	// delta = Σ c_j (y_j − ref) = Σ c_j y_j − (Σ c_j) ref: one pass per
	// model, one to finish. The distance is the one measured when the
	// model came (the reference has moved by at most this node's step
	// since).
	var sumC float64
	for j, m := range e.round {
		c := w
		d := m.dist
		if tau > 0 && d > tau {
			c *= tau / d
			clipped++
		}
		sumC += c
		if j == 0 {
			f32.Scale(delta, m.v, float32(c))
		} else {
			f32.AddScaled(delta, m.v, float32(c))
		}
		n.m.staleness.Observe(float64(now - m.step))
	}
	f32.AddScaledAndAdd(delta, e.ref, -float32(sumC))
	e.recycleLocked()
	if n.ov != nil { // (an exchange under test has no overlay: spacing 1)
		e.spacing = spacingFor(n.population(), e.s)
	}
	n.xm.merged.Add(float64(k))
	n.xm.merges.Inc()
	if clipped > 0 {
		n.xm.clipped.Add(float64(clipped))
	}
	return k
}

// radiusLocked is the clip radius: clipFactor × the median distance of
// recent models taken (0, no clipping, before there is one). e.mu is held.
func (e *epidemic) radiusLocked() float64 {
	ds := e.dists.values()
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return clipFactor * ds[len(ds)/2]
}

// recycleLocked empties the round. e.mu is held.
func (e *epidemic) recycleLocked() {
	for _, m := range e.round {
		e.free = append(e.free, m.v)
	}
	clear(e.round)
	e.round = e.round[:0]
	e.held = 0
}

// buffer returns a model buffer to decode a received model into.
func (e *epidemic) buffer() []float32 {
	e.mu.Lock()
	defer e.mu.Unlock()
	if k := len(e.free); k > 0 {
		v := e.free[k-1]
		e.free = e.free[:k-1]
		return v
	}
	return make([]float32, e.p)
}

// release gives back a buffer that holds no model of the round.
func (e *epidemic) release(v []float32) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.free) < e.poolSize() {
		e.free = append(e.free, v)
	}
}

// setStep does nothing: a model carries its sender's step, and a received
// one is judged against the node's step as it is then.
func (e *epidemic) setStep(int64) {}

// restart makes params the reference (nil: none until the next push) and
// drops the round: its models were for the old model.
func (e *epidemic) restart(params []float64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if params == nil {
		e.ref = nil
	} else if len(params) == e.p {
		if e.ref == nil {
			e.ref = make([]float32, e.p)
		}
		for i, x := range params {
			e.ref[i] = float32(x)
		}
	}
	e.recycleLocked()
}

// model is the reference as float64: the node's model after its last
// step and average (nil before its first step).
func (e *epidemic) model() []float64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ref == nil {
		return nil
	}
	out := make([]float64, len(e.ref))
	for i, x := range e.ref {
		out[i] = float64(x)
	}
	return out
}

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

// sendModel sends the reference, the node's model after step, to S peers
// drawn from the barrier's sampler, in the background (sendTo).
// It is encoded once into the request every peer's stream carries.
func (e *epidemic) sendModel(step int64) {
	n := e.n
	req, ok := e.request(step)
	if !ok {
		return
	}
	e.sendMu.Lock()
	defer e.sendMu.Unlock()
	if e.closed {
		return
	}
	// The request's buffer goes back to the pool when its last send ends.
	var users atomic.Int32
	users.Store(1)
	release := func() {
		if users.Add(-1) == 0 {
			e.putRequest(req)
		}
	}
	defer release()
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
		users.Add(1)
		e.wg.Go(func() { // ends within 10 × QueryTimeout, or when the node closes
			defer func() { <-e.sends }()
			defer release()
			n.sendTo(p, step, req)
		})
	}
}

// requestBuffer returns a buffer for a request of up to size payload
// bytes (wire.StartExchange's layout), from the pool when it has one.
func (e *epidemic) requestBuffer(size int) []byte {
	var buf []byte
	if v, ok := e.requests.Get().(*[]byte); ok {
		buf = *v
	}
	return wire.StartExchange(buf, byte(ExchangeEpidemic), size)
}

// putRequest gives a request's buffer back to the pool.
func (e *epidemic) putRequest(req wire.ExchangeRequest) {
	if req.Buf != nil {
		e.requests.Put(&req.Buf)
	}
}

// request is the exchange request that carries the reference, the node's
// model after step (or, for a node playing a poisoner, what faults.Poison
// makes of it). ok is false when there is nothing to send.
func (e *epidemic) request(step int64) (req wire.ExchangeRequest, ok bool) {
	n := e.n
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ref == nil {
		return wire.ExchangeRequest{}, false
	}
	if poison := n.cfg.faults.Poison; poison != nil {
		params := make([]float64, len(e.ref))
		for i, x := range e.ref {
			params[i] = float64(x)
		}
		payload := poison(step, params)
		if payload == nil {
			return wire.ExchangeRequest{}, false
		}
		return wire.EndExchange(append(wire.StartExchange(nil, byte(ExchangeEpidemic), len(payload)), payload...)), true
	}
	if i, v := f32.BeyondValues(e.ref, float32(min(e.lim.MaxAbsValue, math.MaxFloat32))); i >= 0 {
		n.xm.sendFailed.WithLabelValues(sendInvalid).Inc()
		n.log.Warn("model not sent: a parameter is not finite or exceeds MaxAbsValue", "step", step, "index", i, "value", v)
		return wire.ExchangeRequest{}, false
	}
	b, err := gossip.AppendDense32(e.requestBuffer(gossip.MaxEncodedSize(len(e.ref))), e.self, step, e.lim.ModelID, e.ref)
	if err != nil {
		n.xm.sendFailed.WithLabelValues(sendInvalid).Inc()
		n.log.Warn("model not sent", "step", step, "err", err)
		return wire.ExchangeRequest{}, false
	}
	return wire.EndExchange(b), true
}

// screen says, from a request's header alone, whether this node refuses
// the model that follows: the sender runs another exchange, or has sent
// its share since this node's last average, or the round is full.
func (e *epidemic) screen(from peer.ID, kind ExchangeKind) gossip.Reason {
	if kind != ExchangeEpidemic {
		return e.n.otherExchange(from, kind)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.roomLocked(from)
}

// roomLocked is why the round has no room for a model of from ("" when it
// has). e.mu is held.
func (e *epidemic) roomLocked(from peer.ID) gossip.Reason {
	for _, m := range e.round {
		if m.from == from {
			if m.replaced >= maxPerSender-1 {
				return wire.ReasonRate
			}
			return ""
		}
	}
	if last, ok := e.lastIn[from]; ok && e.rounds-last < e.spacing {
		return wire.ReasonRate // sooner than a sender that samples its peers would come again
	}
	if len(e.round) >= e.poolSize() {
		return wire.ReasonRate
	}
	if e.ref == nil && e.held+4*e.p > maxHeldBytes {
		return wire.ReasonRate
	}
	return ""
}

// accept checks a received model's payload once its header passed
// screen: the sender's lineage, validation, the distance bound; a model
// taken joins the round, replacing its sender's earlier one.
func (e *epidemic) accept(from peer.ID, payload []byte) gossip.Reason {
	n := e.n
	if n.cfg.faults.Loss > 0 && n.lost() {
		return ""
	}
	if n.lin.fromOther(from, time.Now()) {
		n.lin.otherUpdates.Inc() // a model of another lineage of the job (genesis.go)
		return wire.ReasonOtherLineage
	}
	// The values are checked where they lie in the payload and copied
	// once, into the buffer the round keeps.
	buf := e.buffer()
	u, err := gossip.ValidateInto(payload, buf, from, n.step.Load(), e.lim)
	if err != nil {
		e.release(buf)
		n.log.Debug("model refused", "from", from, "err", err)
		return gossip.ReasonOf(err)
	}
	if r := e.offer(from, u.Step, buf); r != "" {
		e.release(buf)
		n.log.Debug("model refused", "from", from, "step", u.Step, "reason", string(r))
		return r
	}
	n.xm.received.Inc()
	n.xm.receivedBytes.Add(float64(len(payload)))
	n.progress.vouch(from, u.Step, time.Now()) // a model of a step counts as an answer (progress.go)
	if u.Step <= n.step.Load() {
		n.poke() // a peer at or behind us progressed: a waiting barrier may pass now
	}
	return ""
}

// offer takes in a validated model y of peer from after step: refused if
// too far from this node's model or if the round has no room for it, else
// put in the round (held, before this node's first step), which then owns
// y. It returns the reason for a refusal ("" when taken or held).
func (e *epidemic) offer(from peer.ID, step int64, y []float32) gossip.Reason {
	e.mu.Lock()
	defer e.mu.Unlock()
	if r := e.roomLocked(from); r != "" {
		return r
	}
	bound, ok := e.distanceBoundLocked()
	d := -1.0
	if ok && e.ref != nil {
		d = f32.Dist(y, e.ref)
		if bound > 0 && d > bound {
			return wire.ReasonDistance
		}
	}
	e.putLocked(from, step, y, d)
	return ""
}

// putLocked puts y, from's model after step, in the round, in place of
// from's earlier one. e.mu is held.
func (e *epidemic) putLocked(from peer.ID, step int64, y []float32, dist float64) {
	for _, m := range e.round {
		if m.from == from {
			e.free = append(e.free, m.v)
			m.v, m.step, m.dist = y, step, dist
			m.replaced++
			return
		}
	}
	e.round = append(e.round, &inModel{from: from, step: step, v: y, dist: dist})
	if len(e.lastIn) >= maxSeen {
		clear(e.lastIn) // rare: a very large or churny job
	}
	e.lastIn[from] = e.rounds
	if e.ref == nil {
		e.held += 4 * e.p
	}
}

// releaseHeldLocked judges the models held before the node's first step,
// now that it has a reference. e.mu is held.
func (e *epidemic) releaseHeldLocked() {
	if e.held == 0 || e.ref == nil {
		return
	}
	e.held = 0
	bound, ok := e.distanceBoundLocked()
	if !ok || bound <= 0 {
		return
	}
	kept := e.round[:0]
	refused := 0
	for _, m := range e.round {
		d := f32.Dist(m.v, e.ref)
		if d > bound {
			refused++
			e.free = append(e.free, m.v)
			continue
		}
		m.dist = d
		kept = append(kept, m)
	}
	clear(e.round[len(kept):])
	e.round = kept
	if refused > 0 {
		e.n.xm.rejected.WithLabelValues(string(wire.ReasonDistance)).Add(float64(refused))
	}
}

// distanceBound is the norm bound's counterpart for models: a received
// model is refused if its distance to this node's model exceeds
// NormBound × (1 + S) × the upper quartile of the norms of this node's own recent steps.
// Averaged with k ≈ S others, a model at that distance moves this node's
// model by about NormBound of its own steps: the most one gossip update
// may (exchange_gossip.go). Honest peers' models differ from ours by the
// consensus distance and the steps they are ahead or behind, a few steps'
// worth. ok is false until the node has made a step; bound is 0 when the
// check is off (NormBound 0).
func (e *epidemic) distanceBound() (bound float64, ok bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.distanceBoundLocked()
}

func (e *epidemic) distanceBoundLocked() (bound float64, ok bool) {
	nb := e.n.cfg.NormBound
	if nb <= 0 {
		return 0, true
	}
	med, ok := e.norms.reference()
	if !ok {
		return 0, false
	}
	return nb * float64(1+e.s) * med, true
}
