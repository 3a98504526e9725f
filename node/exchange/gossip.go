package exchange

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/pspnode/pspnode/gossip"
	"github.com/pspnode/pspnode/internal/f32"
	"github.com/pspnode/pspnode/internal/faults"
	"github.com/pspnode/pspnode/internal/wire"
)

// gossipExchange is the gossip exchange (see the package comment): each step's delta is published on the job's GossipSub
// topic, and every delta received is added to the model, if its norm is
// within the norm bound.
type gossipExchange struct {
	*base
	gs *gossip.Gossip
	// buf receives each sparse update, made dense, before the task
	// applies it. Gossip handlers run one at a time, so one buffer serves
	// them all and the receive path allocates nothing per update.
	buf []float32

	mu           sync.Mutex
	norms        ownNorms  // this node's recent updates: the norm bound's reference
	held         heldVecs  // updates received before the first own step
	normRefused  int       // updates refused by the norm bound since the last warning
	normWarnedAt time.Time // when that warning was
}

// newGossipExchange is n's gossip exchange before it joins the topic: the
// norm bound and the held updates, with nothing to publish on.
func newGossip(b *base) *gossipExchange {
	g := &gossipExchange{base: b, norms: newOwnNorms()}
	b.serveWith(g)
	return g
}

// joinGossip is n's gossip exchange on the job's update topic.
func joinGossip(ctx context.Context, b *base) (*gossipExchange, error) {
	g := newGossip(b)
	gcfg := b.d.Gossip
	gcfg.Job = b.d.Job
	gcfg.ParamCount = b.d.Model.NumParams()
	gcfg.ModelID = b.d.Model.ModelID()
	gcfg.MaxAbsValue, gcfg.MaxStepAhead = b.cfg.MaxAbsValue, b.cfg.MaxStepAhead
	gcfg.Handler = g.onUpdate
	if b.d.Faults.Loss > 0 {
		faults.SetGossipDrop(&gcfg, b.d.Lost)
	}
	if gcfg.Logger == nil {
		gcfg.Logger = b.d.Log
	}
	if gcfg.Registerer == nil {
		gcfg.Registerer = b.d.Registry
	}
	gs, err := gossip.New(ctx, b.d.Host, gcfg)
	if err != nil {
		return nil, err
	}
	g.gs = gs
	return g, nil
}

// Push publishes the step's delta on the topic: it copies it into the
// message (gossip.Encode: as it is under the dense32 encoding), calls
// copied, and signs and sends the message; then it notes the delta's norm
// (noteOwnNorm).
func (g *gossipExchange) Push(ctx context.Context, step int64, delta []float32, copied func()) {
	g.gs.SetLocalStep(step)
	if delta == nil {
		done(copied)
		return
	}
	nrm := f32.Norm(delta)
	var err error
	if poison := g.d.Faults.Poison; poison != nil {
		raw := poison(step, delta)
		done(copied)
		if raw != nil {
			err = faults.PublishRaw(g.gs, ctx, raw)
		}
	} else {
		var msg *gossip.Message
		msg, err = g.gs.Encode(step, delta)
		done(copied)
		if err == nil {
			err = g.gs.PublishEncoded(ctx, msg)
		}
	}
	if err != nil && ctx.Err() == nil {
		g.d.Log.Warn("publish failed", "step", step, "err", err)
	}
	g.noteOwnNorm(nrm)
}

// noteOwnNorm records nrm, the norm of an update this node computed
// itself, and, after the node's first step, checks and applies the
// updates that arrived before it had a reference norm.
func (g *gossipExchange) noteOwnNorm(nrm float64) {
	g.mu.Lock()
	if !g.norms.noteNorm(nrm) {
		g.mu.Unlock()
		return
	}
	held := g.held.take()
	g.mu.Unlock()
	for _, v := range held {
		if g.withinNorm(v, "") {
			g.apply(v, -1)
		}
	}
}

// Merge does nothing: updates go to the model as they arrive (onUpdate).
func (g *gossipExchange) Merge(int64, []float32) int { return 0 }

// Restart drops the updates held before the first step: they were for
// the old model.
func (g *gossipExchange) Restart([]float32) {
	g.mu.Lock()
	g.held.take()
	g.mu.Unlock()
}

// ReadModel: a gossip node holds no model of its own beside its task's.
func (g *gossipExchange) ReadModel(int, int, []float32) bool { return false }

// Offer refuses every model of the exchange protocol: a gossip node
// serves it only to say it runs another exchange.
func (g *gossipExchange) Offer(from peer.ID, o wire.Offer) gossip.Reason {
	return g.otherExchange(from, Kind(o.Kind))
}

func (g *gossipExchange) Block(peer.ID, wire.Offer, int, []float32) gossip.Reason {
	return wire.ReasonExchangeMismatch
}

func (g *gossipExchange) End(_ peer.ID, _ wire.Offer, _ int, reason gossip.Reason) gossip.Reason {
	return reason
}

func (g *gossipExchange) Close() error { return g.gs.Close() }

// onUpdate applies a validated update from the gossip topic: the norm
// bound, then the model (a sparse update as a dense vector, in buf).
func (g *gossipExchange) onUpdate(u gossip.Update) {
	if g.d.Node.OtherLineage(u.Sender) {
		return // a delta of another lineage of the job
	}
	v := u.Values
	if u.Encoding.Sparse() {
		if g.buf == nil { // made at its first use: a dense update needs none
			g.buf = make([]float32, g.d.Model.NumParams())
		}
		clear(g.buf)
		if err := u.AddTo(g.buf, 1); err != nil {
			add(g.d.Counters.ApplyRejected, 1)
			g.d.Log.Debug("update refused", "from", u.Sender, "step", u.Step, "err", err)
			return
		}
		v = g.buf
	}
	if !g.withinNorm(v, u.Sender) {
		return
	}
	if g.apply(v, u.Step) {
		g.heard(u.Sender, u.Step) // an update of a step counts as an answer, and may wake the barrier
	}
}

// apply adds a received update, made at step (-1: not known), to the
// model, and reports whether the model took it.
func (g *gossipExchange) apply(v []float32, step int64) bool {
	if err := g.d.Model.Apply(v, step); err != nil {
		add(g.d.Counters.ApplyRejected, 1)
		g.d.Log.Debug("update refused by the model", "err", err)
		return false
	}
	add(g.d.Counters.Applied, 1)
	return true
}

// withinNorm reports whether a received update v is within NormBound × the
// upper quartile of the norms of this node's own recent updates, and counts it if not.
// Honest peers train the same model on shards of the same data at the same
// learning rate, so their updates are of the same size as ours; an update
// far larger is a poisoner's, or a broken peer's, and is dropped whole:
// scaling it down instead would still let a poisoner push a few honest
// updates' worth in a direction of its choice with every message. The
// reference is our own updates, which no peer can inflate.
//
// Until this node has made a step of its own there is no reference: the
// update is then held (up to maxHeldBytes; beyond, refused) and checked
// after the first step, and withinNorm returns false. v is copied.
func (g *gossipExchange) withinNorm(v []float32, from peer.ID) bool {
	if g.cfg.NormBound <= 0 {
		return true
	}
	g.mu.Lock()
	med, ok := g.norms.reference()
	if !ok {
		held := g.held.hold(slices.Clone(v))
		g.mu.Unlock()
		if !held {
			add(g.d.Counters.NormRefused, 1)
		}
		return false
	}
	g.mu.Unlock()
	if nrm := f32.Norm(v); nrm > g.cfg.NormBound*med {
		g.refusedNorm(from, nrm, g.cfg.NormBound*med)
		return false
	}
	return true
}

// normWarnEvery is the least time between two warnings of updates refused
// by the norm bound; the ones between are counted, and the next warning
// says how many.
const normWarnEvery = 10 * time.Second

// refusedNorm counts an update refused by the norm bound and says so, at
// most once per normWarnEvery.
func (g *gossipExchange) refusedNorm(from peer.ID, nrm, bound float64) {
	add(g.d.Counters.NormRefused, 1)
	g.mu.Lock()
	g.normRefused++
	now := time.Now()
	if now.Sub(g.normWarnedAt) < normWarnEvery {
		g.mu.Unlock()
		return
	}
	count := g.normRefused
	g.normRefused, g.normWarnedAt = 0, now
	g.mu.Unlock()
	g.d.Log.Warn("received updates refused: their norm is beyond NormBound times this node's own updates' (a poisoner's, or a peer of another learning rate or batch)",
		"refused", count, "since_last_warning", normWarnEvery, "last_from", from, "last_norm", nrm, "bound", bound)
}
