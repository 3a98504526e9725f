package exchange

import (
	"context"
	"math"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/pspnode/pspnode/gossip"
	"github.com/pspnode/pspnode/internal/f32"
	"github.com/pspnode/pspnode/internal/ring"
	"github.com/pspnode/pspnode/internal/wire"
)

// epidemic is the epidemic exchange, Epidemic Learning (see the package
// comment): after each step the node's model goes to S
// sampled peers over the exchange protocol (send.go), and before
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
	*base
	self peer.ID
	s    int
	lim  gossip.Limits
	p    int // parameters

	mu       sync.Mutex
	ref      []float32          // the model after the last step and average; nil before the first step
	norms    ownNorms           // this node's recent step norms: the distance bound's reference
	dists    ring.Ring          // distances to ref of the models of recent averages: the clip radius's reference
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
	// maxSenders bounds the senders whose last average is remembered.
	maxSenders = 8192
)

// newEpidemic is the epidemic exchange of b's node.
func newEpidemic(b *base) *epidemic {
	params := b.d.Model.NumParams()
	e := &epidemic{
		base:    b,
		self:    b.d.Host.ID(),
		s:       b.cfg.S,
		p:       params,
		lim:     b.cfg.limits(params, b.d.Model.ModelID()),
		norms:   newOwnNorms(),
		dists:   ring.New(distWindow),
		lastIn:  make(map[peer.ID]uint64),
		spacing: 1,
		sends:   make(chan struct{}, 2*b.cfg.S),
	}
	b.serveWith(e)
	return e
}

// spacingFor is how many averages must pass before a sender's model is
// taken again, in a job of population nodes where each sends its model to
// s sampled peers: a quarter of the averages between two of an honest
// sender's models to this node, (N − 1)/s, and at least 1 (an honest
// Model comes sooner, and is refused, about one time in five: in a clean
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

// Push takes the model of a built-in task after step (its float64
// parameters, converted once) as the reference and sends it to S peers;
// upd, the step's delta, is a norm of the node's own steps. The first push
// judges the models held until then.
func (e *epidemic) Push(_ context.Context, step int64, upd []float64) {
	if e.refFromTask(upd) {
		e.sendModel(step)
	}
}

// refFromTask makes the built-in task's model the reference, notes upd's
// norm and judges the models held until then; false when the task has no
// Model of the exchange's size.
func (e *epidemic) refFromTask(upd []float64) bool {
	params := e.d.Model.Params()
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

// Push32 takes a trainer's model after step: it copies model (the
// caller's buffer, not kept) into the reference, notes the norm of the
// step that made it (its distance from the reference, which holds the
// Model after the last step and average), and sends it to S peers. The
// first push judges the models held until then.
func (e *epidemic) Push32(_ context.Context, step int64, model []float32, copied func()) {
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

// Merge averages a built-in task's model with the models received since
// the last call (Epidemic Learning's aggregation, clipped). Only the
// stepping goroutine calls it, between steps, so nothing else writes the
// Model meanwhile (an epidemic node applies no gossip updates).
func (e *epidemic) Merge() {
	if e.scratch == nil {
		e.scratch = make([]float32, e.p)
	}
	k := e.Merge32(e.scratch)
	if k == 0 {
		return
	}
	e.scratch2 = e.d.Model.Params()
	for i, d := range e.scratch {
		e.scratch2[i] += float64(d)
	}
	if err := e.d.Model.SetParams(e.scratch2); err != nil {
		add(e.d.Counters.ApplyRejected, 1)
		e.d.Log.Warn("averaging received models failed; keeping this node's model", "models", k, "err", err)
	}
}

// Merge32 computes the change the average of this node's model and the
// models of the round makes, into delta (NumParams values), and takes it
// into the reference; it returns how many models it averaged (0: none,
// and delta is untouched). The stepping goroutine (the trainer's call)
// calls it between steps.
func (e *epidemic) Merge32(delta []float32) int {
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
		e.dists.Add(m.dist)
	}
	tau := e.radiusLocked()
	k := len(e.round)
	w := 1 / float64(1+k)
	now := e.d.Node.Step()
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
		observe(e.d.Counters.Staleness, float64(now-m.step))
	}
	f32.AddScaledAndAdd(delta, e.ref, -float32(sumC))
	e.recycleLocked()
	e.spacing = spacingFor(e.d.Node.Population(), e.s)
	e.m.merged.Add(float64(k))
	e.m.merges.Inc()
	if clipped > 0 {
		e.m.clipped.Add(float64(clipped))
	}
	return k
}

// radiusLocked is the clip radius: clipFactor × the median distance of
// recent models taken (0, no clipping, before there is one). e.mu is held.
func (e *epidemic) radiusLocked() float64 {
	ds := e.dists.Values()
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

// SetStep does nothing: a model carries its sender's step, and a received
// one is judged against the node's step as it is then.
func (e *epidemic) SetStep(int64) {}

// Restart makes params the reference (nil: none until the next push) and
// drops the round: its models were for the old model.
func (e *epidemic) Restart(params []float64) {
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

// Model is the reference as float64: the node's model after its last
// step and average (nil before its first step).
func (e *epidemic) Model() []float64 {
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
func (e *epidemic) ScalesLR() bool { return false }

// WaitMesh and WaitSubscribed do nothing: models go to peers sampled when
// they are sent, over streams of their own.
func (e *epidemic) WaitMesh(context.Context)       {}
func (e *epidemic) WaitSubscribed(context.Context) {}

func (e *epidemic) Topic() *gossip.Gossip { return nil }

// Updates are the models sent (one per peer) and taken, and the refused
// ones by reason.
func (e *epidemic) Updates() gossip.Stats {
	st := gossip.Stats{Rejected: map[gossip.Reason]uint64{}}
	x := e.Stats()
	st.Sent, st.SentBytes, st.Received, st.ReceivedBytes = x.Sent, x.SentBytes, x.Received, x.ReceivedBytes
	for r, c := range x.Rejected {
		st.Rejected[gossip.Reason(r)] = c
	}
	return st
}

// Close waits for the sends in flight; Deps.Life has ended, so they are
// ending.
func (e *epidemic) Close() error {
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
	for _, p := range e.d.Node.Sample(e.d.Life, e.s) {
		select {
		case e.sends <- struct{}{}:
		default:
			// As many sends as two rounds' worth are still in flight:
			// the peers are slower than this node's steps. Skip rather
			// than queue.
			e.m.sendFailed.WithLabelValues(sendSkipped).Inc()
			continue
		}
		users.Add(1)
		e.wg.Go(func() { // ends within 10 × QueryTimeout, or when the node closes
			defer func() { <-e.sends }()
			defer release()
			e.sendTo(p, step, req)
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
	return wire.StartExchange(buf, byte(Epidemic), size)
}

// putRequest gives a request's buffer back to the pool.
func (e *epidemic) putRequest(req wire.ExchangeRequest) {
	if req.Buf != nil {
		e.requests.Put(&req.Buf)
	}
}

// request is the exchange request that carries the reference, the node's
// Model after step (or, for a node playing a poisoner, what faults.Poison
// makes of it). ok is false when there is nothing to send.
func (e *epidemic) request(step int64) (req wire.ExchangeRequest, ok bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ref == nil {
		return wire.ExchangeRequest{}, false
	}
	if poison := e.d.Faults.Poison; poison != nil {
		params := make([]float64, len(e.ref))
		for i, x := range e.ref {
			params[i] = float64(x)
		}
		payload := poison(step, params)
		if payload == nil {
			return wire.ExchangeRequest{}, false
		}
		return wire.EndExchange(append(wire.StartExchange(nil, byte(Epidemic), len(payload)), payload...)), true
	}
	if i, v := f32.BeyondValues(e.ref, float32(min(e.lim.MaxAbsValue, math.MaxFloat32))); i >= 0 {
		e.m.sendFailed.WithLabelValues(sendInvalid).Inc()
		e.d.Log.Warn("model not sent: a parameter is not finite or exceeds MaxAbsValue", "step", step, "index", i, "value", v)
		return wire.ExchangeRequest{}, false
	}
	b, err := gossip.AppendDense32(e.requestBuffer(gossip.MaxEncodedSize(len(e.ref))), e.self, step, e.lim.ModelID, e.ref)
	if err != nil {
		e.m.sendFailed.WithLabelValues(sendInvalid).Inc()
		e.d.Log.Warn("model not sent", "step", step, "err", err)
		return wire.ExchangeRequest{}, false
	}
	return wire.EndExchange(b), true
}

// Screen says, from a request's header alone, whether this node refuses
// the model that follows: the sender runs another exchange, or has sent
// its share since this node's last average, or the round is full.
func (e *epidemic) Screen(from peer.ID, kind byte) gossip.Reason {
	if Kind(kind) != Epidemic {
		return e.otherExchange(from, Kind(kind))
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

// Accept checks a received model's payload once its header passed
// screen: the sender's lineage, validation, the distance bound; a model
// taken joins the round, replacing its sender's earlier one.
func (e *epidemic) Accept(from peer.ID, payload []byte) gossip.Reason {
	if e.d.Faults.Loss > 0 && e.d.Lost() {
		return ""
	}
	if e.d.Node.OtherLineage(from) {
		return wire.ReasonOtherLineage // a model of another lineage of the job
	}
	// The values are checked where they lie in the payload and copied
	// once, into the buffer the round keeps.
	buf := e.buffer()
	u, err := gossip.ValidateInto(payload, buf, from, e.d.Node.Step(), e.lim)
	if err != nil {
		e.release(buf)
		e.d.Log.Debug("model refused", "from", from, "err", err)
		return gossip.ReasonOf(err)
	}
	if r := e.offer(from, u.Step, buf); r != "" {
		e.release(buf)
		e.d.Log.Debug("model refused", "from", from, "step", u.Step, "reason", string(r))
		return r
	}
	e.m.received.Inc()
	e.m.receivedBytes.Add(float64(len(payload)))
	e.heard(from, u.Step) // a model of a step counts as an answer, and may wake the barrier
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
	if len(e.lastIn) >= maxSenders {
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
		e.m.rejected.WithLabelValues(string(wire.ReasonDistance)).Add(float64(refused))
	}
}

// distanceBound is the norm bound's counterpart for models: a received
// Model is refused if its distance to this node's model exceeds
// NormBound × (1 + S) × the upper quartile of the norms of this node's own recent steps.
// Averaged with k ≈ S others, a model at that distance moves this node's
// Model by about NormBound of its own steps: the most one gossip update
// may (gossip.go). Honest peers' models differ from ours by the
// consensus distance and the steps they are ahead or behind, a few steps'
// worth. ok is false until the node has made a step; bound is 0 when the
// check is off (NormBound 0).
func (e *epidemic) distanceBound() (bound float64, ok bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.distanceBoundLocked()
}

func (e *epidemic) distanceBoundLocked() (bound float64, ok bool) {
	nb := e.cfg.NormBound
	if nb <= 0 {
		return 0, true
	}
	med, ok := e.norms.reference()
	if !ok {
		return 0, false
	}
	return nb * float64(1+e.s) * med, true
}
