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
	"github.com/pspnode/pspnode/internal/wire"
)

// epidemic is the epidemic exchange, Epidemic Learning (see the package
// comment): after each step the node's model goes to S sampled peers
// over the exchange protocol (send.go), and at each step the node averages
// its model with the models received since its last one.
//
// Memory. The node holds two float32 vectors of the model's size (four
// when it sends its model compressed: the model as sent and the rounding's
// residual), however many peers send it models: ref, its model after its last step and
// average (the reference received models are judged by, and the model it
// sends), and acc, the sum of what arrived this round. Models are taken in
// block by block as they stream in (wire.ExchangeBlock values a block):
// each block is checked, judged by its distance to ref's block and added,
// clipped, into acc's, in the block's buffer of the receive budget, which
// bounds what all receives hold together. A sent model is read from ref
// block by block as it goes out: there is no copy of it per peer or per
// step.
//
// The average is Epidemic Learning's, block by block: with the round's
// blocks y_j of block b, each pulled toward the node's model x by a factor
// c_j ≤ 1 (its staleness weight, Config.StaleSteps, times its clip
// factor), the block becomes x + (Σ c_j y_j − (Σ c_j) x)/(1 + k_b),
// k_b the models that sent the block (a model whose transfer was cut short
// counts for the blocks that came). A trainer's step takes its model x
// and the round into ref in one pass (Merge of a step). Refusing a block
// leaves the blocks taken before it: each is judged alone, by the same
// rules.
//
// The average is robust to a peer that pushes models in one direction,
// round after round (self-centred clipping, after He, Karimireddy and
// Jaggi, "Byzantine-Robust Decentralized Learning via ClippedGossip",
// 2022), per block:
//
//   - one vote per sender per average: a sender whose model this round
//     took is refused at its offer (rate) until the next average, and a
//     sender counts at most once in (N − 1)/(4S) averages (spacingFor),
//     about as often as an honest peer that samples its S peers comes;
//   - each block's pull on this node's model, y − ref, is clipped to a
//     radius τ_b: clipFactor × the lower quartile of the latest distance
//     of the block of each sender among the recent ones, a reference the
//     pushers cannot move while more than a quarter of the senders are
//     honest, however often each pusher comes; a block farther than the
//     distance bound (distanceBound) is refused, and the rest of its
//     model with it.
type epidemic struct {
	*base
	s     int
	p     int         // parameters
	lay   wire.Layout // the model's fragments and blocks (Config.Fragments)
	nb    int         // blocks
	id    uint32
	limit uint32 // f32.Limit of MaxAbsValue
	ahead int64  // MaxStepAhead (<= 0: no check)

	// rmu guards ref: the trainer's step writes it, sends and receives
	// read it a block at a time. Taken before mu.
	rmu sync.RWMutex
	ref []float32 // the model after the last step and average; nil before the first step
	cur int       // the fragment of the last step pushed: the one its average takes in
	has atomic.Bool
	// Compressed sends (Config.Encoding bf16, int8 or int4): sent is the model
	// as receivers decode it, made once a round, and resid what rounding
	// left out of it, added to the next round's model before it is
	// rounded (error feedback); nil until the first compressed send.
	sent, resid []float32

	mu         sync.Mutex
	acc        []float32 // this round's Σ c_j y_j, block by block
	blk        []blockState
	round      map[peer.ID]*inModel // the senders of this round, and the transfers under way
	merged     int                  // senders of this round whose blocks were taken
	rounds     uint64               // averages since the first step
	lastIn     map[peer.ID]uint64   // the average each sender's last model went into
	senders    map[peer.ID]uint32   // a number for each sender of recent distances (senderIndexLocked)
	nextSender uint32
	spacing    uint64 // averages between two models of one sender (spacingFor)

	budget *wire.BlockBudget

	// Sending: one model in flight per peer (busy), at most 2S in all;
	// wg waits for them at close. sendMu orders starting a send against
	// close: once closed is set no send starts.
	sendMu sync.Mutex
	busy   map[peer.ID]bool
	closed bool
	wg     sync.WaitGroup
	bufs   sync.Pool // block buffers of sends
}

// blockState is one block's round and references.
type blockState struct {
	sumC  float64 // Σ c_j of the round's blocks in acc
	k     int     // blocks in acc this round
	dists senderDists
	norms ownNorms
}

// inModel is a sender of the round.
type inModel struct {
	step   int64
	active bool // its transfer is under way
	taken  bool // a block of it went into this round
}

const (
	// clipFactor × the lower quartile of the senders' recent distances
	// is the clip radius (senderDists.radius): an honest model is pulled
	// in a little, and a sender that pushes one way moves this node's
	// model by at most about that much per round, shared with the other
	// senders.
	clipFactor = 1
	// clipQuantile is the quantile of the senders' distances the radius
	// reads: the lower quartile. The median of every recent model's
	// distance let two drift poisoners beside three honest nodes hold the
	// honest loss within 1.5× but as many as the honest nodes take it to
	// 6e6 (three) and 7e8 (ten) in 40 s; the lower quartile of one
	// distance a sender holds both at 0.0077 and 0.021 (clean 0.005), and
	// trains clean runs alike. Rounded to the nearest rank, two against
	// three escaped once in nine runs (4.7e8): with an honest sender out
	// of the recent ones, the second of three was a pusher's.
	clipQuantile = 0.25
	// distWindow is how many recent models' distances the radius reads.
	distWindow = 64
	// minRoundPool is the least number of senders one average takes.
	minRoundPool = 8
	// maxSenders bounds the senders whose last average is remembered.
	maxSenders = 8192
	// receiveBlocks is the receive budget: the blocks all receives read
	// at once (4 MiB).
	receiveBlocks = 4
)

// newEpidemic is the epidemic exchange of b's node.
func newEpidemic(b *base) *epidemic {
	params := b.d.Model.NumParams()
	e := &epidemic{
		base:    b,
		s:       b.cfg.S,
		p:       params,
		lay:     wire.Layout{N: params, F: b.cfg.Fragments},
		id:      b.d.Model.ModelID(),
		limit:   f32.Limit(float32(min(b.cfg.MaxAbsValue, math.MaxFloat32))),
		ahead:   b.cfg.MaxStepAhead,
		acc:     make([]float32, params),
		round:   make(map[peer.ID]*inModel),
		lastIn:  make(map[peer.ID]uint64),
		senders: make(map[peer.ID]uint32),
		spacing: 1,
		budget:  wire.NewBlockBudget(receiveBlocks, params),
		busy:    make(map[peer.ID]bool),
	}
	e.nb = e.lay.Blocks()
	e.blk = make([]blockState, e.nb)
	for i := range e.blk {
		e.blk[i] = blockState{dists: newSenderDists(distWindow), norms: newOwnNorms()}
	}
	b.server = &wire.ExchangeServer{Life: b.d.Life, Timeout: b.d.SendTimeout, Kind: byte(Epidemic), ModelID: e.id, N: params,
		Fragments: e.lay.Frags(), Judge: e, Budget: e.budget, Rejected: b.m.rejected, Declined: b.m.declined, Log: b.d.Log}
	return e
}

// poolSize is how many senders one average takes.
func (e *epidemic) poolSize() int { return max(minRoundPool, 2*e.s) }

// Push takes the node's model after step into the reference: it copies
// x (not kept) into it, notes the norms of the step that made it (its
// distance from the reference, the model after the last average), and
// sends it to S peers. The round is averaged in at the next Merge (which
// can take the model and the round in one pass instead). x nil: nothing.
func (e *epidemic) Push(_ context.Context, step int64, x []float32, copied func()) {
	if len(x) != e.p {
		done(copied)
		return
	}
	e.rmu.Lock()
	first := e.ref == nil
	if first {
		e.ref = slices.Clone(x)
	}
	e.cur = e.lay.FragmentOf(step)
	e.mu.Lock()
	for b := range e.nb {
		lo, hi := e.lay.Range(b)
		if !first {
			e.blk[b].norms.noteNorm(math.Sqrt(f32.CopyDist2(e.ref[lo:hi], x[lo:hi])))
		}
	}
	e.mu.Unlock()
	e.rmu.Unlock()
	e.has.Store(true)
	done(copied)
	e.sendModel(step)
}

// Merge averages the round into x and the reference, block by block.
// With step >= 0, x is the model after step, not pushed: it becomes the
// reference in the same pass (its distance from the reference noted as
// the step's norms), and the average goes to S peers. With step < 0, x
// is the model as the last Push gave it; before the first push, the
// node's model before its first step, which becomes the base the first
// push's norms are measured from (the node still takes no model before
// that push: nothing to average yet). It returns how many senders'
// models it averaged (x is left as it was when 0). The caller has checked
// x.
func (e *epidemic) Merge(step int64, x []float32) int {
	if len(x) != e.p {
		return 0
	}
	e.rmu.Lock()
	first := e.ref == nil
	if first && step < 0 {
		e.ref = slices.Clone(x)
		e.rmu.Unlock()
		return 0
	}
	if first {
		e.ref = slices.Clone(x)
	}
	if step >= 0 {
		e.cur = e.lay.FragmentOf(step)
	}
	e.mu.Lock()
	k := e.averageLocked(x, step >= 0 && !first)
	e.mu.Unlock()
	e.rmu.Unlock()
	if step >= 0 {
		e.has.Store(true)
		e.sendModel(step)
	}
	return k
}

// averageLocked makes x and ref the average of x and the round, block by
// block, noting the distance of x from ref as the step's norm when note
// is set, and starts the next round. It returns the round's senders
// averaged. With fragments only the current fragment's blocks are
// averaged: the others take x, and what arrived for them waits for
// their turn. rmu and mu are held.
func (e *epidemic) averageLocked(x []float32, note bool) int {
	first, count := e.lay.FragmentBlocks(e.cur)
	for b := range e.nb {
		lo, hi := e.lay.Range(b)
		bl := &e.blk[b]
		var d2 float64
		if bl.k == 0 || b < first || b >= first+count {
			d2 = f32.CopyDist2(e.ref[lo:hi], x[lo:hi])
		} else {
			d2 = f32.StepMerge(x[lo:hi], e.ref[lo:hi], e.acc[lo:hi], float32(bl.sumC), float32(1/float64(1+bl.k)))
		}
		if note {
			bl.norms.noteNorm(math.Sqrt(d2))
		}
	}
	return e.nextRoundLocked()
}

// nextRoundLocked ends the round after its average: it counts and
// returns its senders (with fragments, the most that sent a block of the
// current fragment), and clears it but for the transfers under way,
// whose next blocks go into the next round. mu is held.
func (e *epidemic) nextRoundLocked() int {
	e.rounds++ // every average counts, empty or not: the spacing is in this node's steps
	k := e.merged
	first, count := e.lay.FragmentBlocks(e.cur)
	if e.lay.Frags() > 1 {
		k = 0
		for b := first; b < first+count; b++ {
			k = max(k, e.blk[b].k)
		}
	}
	now := e.d.Node.Step()
	for from, m := range e.round {
		if m.taken {
			observe(e.d.Counters.Staleness, float64(now-m.step))
		}
		if !m.active {
			delete(e.round, from)
			continue
		}
		m.taken = false
	}
	for b := first; b < first+count; b++ {
		e.blk[b].k, e.blk[b].sumC = 0, 0
	}
	e.merged = 0
	e.spacing = spacingFor(e.d.Node.Population(), e.s)
	if k > 0 {
		e.m.merged.Add(float64(k))
		e.m.merges.Inc()
	}
	return k
}

// Restart makes params the reference (nil: none until the next push) and
// drops the round: its blocks were for the old model.
func (e *epidemic) Restart(params []float32) {
	e.rmu.Lock()
	defer e.rmu.Unlock()
	if params == nil {
		e.ref = nil
		e.has.Store(false)
	} else if len(params) == e.p {
		if e.ref == nil {
			e.ref = make([]float32, e.p)
		}
		copy(e.ref, params)
		e.has.Store(true)
	}
	clear(e.resid) // it was the old model's
	e.mu.Lock()
	defer e.mu.Unlock()
	for b := range e.blk {
		e.blk[b].k, e.blk[b].sumC = 0, 0
	}
	e.merged = 0
	for from, m := range e.round {
		if !m.active {
			delete(e.round, from)
		}
		m.taken = false
	}
}

// ReadModel copies the values [lo, hi) of the reference into dst and
// returns false when there is none (before the first step).
func (e *epidemic) ReadModel(lo, hi int, dst []float32) bool { return e.read(&e.ref, lo, hi, dst) }

// read copies the values [lo, hi) of *v (ref or sent, read under rmu)
// into dst; false when there is none.
func (e *epidemic) read(v *[]float32, lo, hi int, dst []float32) bool {
	e.rmu.RLock()
	defer e.rmu.RUnlock()
	if *v == nil || hi > len(*v) || lo < 0 || lo > hi {
		return false
	}
	copy(dst, (*v)[lo:hi])
	return true
}

// quantizeRound makes sent, the model this round sends, from the
// reference and the residual of the rounds before (error feedback): sent
// = Q(ref + resid), resid = ref + resid − sent, block by block. A block
// whose sum is not finite or beyond MaxAbsValue drops its residual.
func (e *epidemic) quantizeRound() {
	e.rmu.Lock()
	defer e.rmu.Unlock()
	if e.ref == nil {
		return
	}
	if e.sent == nil {
		e.sent, e.resid = make([]float32, e.p), make([]float32, e.p)
	}
	first, count := e.lay.FragmentBlocks(e.cur) // the blocks this round sends
	for b := first; b < first+count; b++ {
		lo, hi := e.lay.Range(b)
		r, x, q := e.resid[lo:hi], e.ref[lo:hi], e.sent[lo:hi]
		for i := range r {
			r[i] += x[i]
		}
		if !f32.Within(r, e.limit) {
			copy(r, x)
		}
		wire.Quantize(e.cfg.Encoding, q, r)
		for i := range r {
			r[i] -= q[i]
		}
	}
}

// readSent is ReadModel of sent, the model as this round sends it.
func (e *epidemic) readSent(lo, hi int, dst []float32) bool { return e.read(&e.sent, lo, hi, dst) }

// Close waits for the sends in flight; Deps.Life has ended, so they are
// ending.
func (e *epidemic) Close() error {
	e.sendMu.Lock()
	e.closed = true
	e.sendMu.Unlock()
	e.wg.Wait()
	return nil
}

// Offer judges a model's offer (wire.ExchangeJudge): the sender's
// exchange, its lineage, the step, and whether the round has room for it.
// A model it takes joins the round.
func (e *epidemic) Offer(from peer.ID, o wire.Offer) gossip.Reason {
	if Kind(o.Kind) != Epidemic {
		return e.otherExchange(from, Kind(o.Kind))
	}
	if e.d.Faults.Loss > 0 && e.d.Lost() {
		return wire.ReasonRate // a lost model: its sender tries another peer
	}
	if e.d.Node.OtherLineage(from) {
		return wire.ReasonOtherLineage
	}
	if e.ahead > 0 && o.Step > e.d.Node.Step()+e.ahead {
		return gossip.ReasonStepTooFarAhead
	}
	if !e.has.Load() {
		return wire.ReasonNoModel // nothing to judge it by before this node's first step
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if r := e.roomLocked(from); r != "" {
		return r
	}
	e.round[from] = &inModel{step: o.Step, active: true}
	if len(e.lastIn) >= maxSenders {
		clear(e.lastIn) // rare: a very large or churny job
	}
	e.lastIn[from] = e.rounds
	return ""
}

// roomLocked is why the round has no room for a model of from ("" when it
// has). mu is held.
func (e *epidemic) roomLocked(from peer.ID) gossip.Reason {
	if _, ok := e.round[from]; ok {
		return wire.ReasonRate // one model per sender per round
	}
	if last, ok := e.lastIn[from]; ok && e.rounds-last < e.spacing {
		return wire.ReasonRate // sooner than a sender that samples its peers would come again
	}
	if len(e.round) >= e.poolSize() {
		return wire.ReasonRate
	}
	return ""
}

// Block judges block b of from's model and takes it into the round
// (wire.ExchangeJudge): its values, its distance from this node's block
// (the distance bound), and its pull, clipped to the block's radius.
func (e *epidemic) Block(from peer.ID, o wire.Offer, b int, y []float32) gossip.Reason {
	lo, hi := e.lay.Range(b)
	e.rmu.RLock()
	defer e.rmu.RUnlock()
	if e.ref == nil {
		return wire.ReasonNoModel
	}
	d2, ok := f32.CheckDist(y, e.ref[lo:hi], e.limit)
	if !ok {
		if _, x := f32.First(y, e.limit); math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
			return gossip.ReasonNonFinite
		}
		return gossip.ReasonValueTooLarge
	}
	dist := math.Sqrt(d2)
	e.mu.Lock()
	defer e.mu.Unlock()
	bl := &e.blk[b]
	if bound, ok := e.distanceBoundLocked(b); ok && bound > 0 && dist > bound {
		return wire.ReasonDistance
	}
	c := e.cfg.staleWeight(e.d.Node.Step() - o.Step) // a stale model pulls less
	if tau := bl.dists.radius(); tau > 0 && dist > tau {
		c *= tau / dist
		e.m.clipped.Inc()
	}
	if bl.k == 0 {
		f32.ScaleTo(e.acc[lo:hi], y, float32(c))
	} else {
		f32.Axpy(e.acc[lo:hi], y, float32(c))
	}
	bl.k++
	bl.sumC += c
	bl.dists.add(e.senderIndexLocked(from), dist)
	if m := e.round[from]; m != nil && !m.taken {
		m.taken = true
		e.merged++
	}
	return ""
}

// End ends a transfer (wire.ExchangeJudge): a whole model counts as
// received and as its sender's answer at the barrier.
func (e *epidemic) End(from peer.ID, o wire.Offer, taken int, reason gossip.Reason) gossip.Reason {
	e.mu.Lock()
	if m := e.round[from]; m != nil {
		m.active = false
	}
	e.mu.Unlock()
	if reason != "" || taken < int(o.Count) {
		return reason
	}
	e.m.received.Inc()
	lo, hi := o.Layout().Fragment(int(o.Fragment))
	e.m.receivedBytes.Add(float64(4 * (hi - lo)))
	e.heard(from, o.Step) // a model of a step counts as an answer, and may wake the barrier
	return ""
}
