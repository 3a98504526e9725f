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
	// buf receives each decoded update before the task applies it.
	// Gossip handlers run one at a time, so one buffer serves them all and
	// the receive path allocates nothing per update.
	buf []float64

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

// Push publishes the step's update on the topic.
func (g *gossipExchange) Push(ctx context.Context, step int64, upd []float64) {
	g.gs.SetLocalStep(step)
	if upd != nil {
		g.noteOwnNorm(upd)
		g.publish(ctx, step, upd)
	}
}

// Push32 publishes a driven node's float32 delta of step, which its
// caller checked, as it is (gossip.Encode32: no float64 copy under the
// dense32 encoding): the delta is copied into the message, copied is
// called, and the message is signed and sent.
func (g *gossipExchange) Push32(ctx context.Context, step int64, delta []float32, copied func()) {
	g.gs.SetLocalStep(step)
	if delta == nil {
		done(copied)
		return
	}
	g.mu.Lock()
	noted := g.norms.noteNorm(f32.Norm(delta))
	var held [][]float64
	if noted {
		held = g.held.take()
	}
	g.mu.Unlock()
	if g.d.Faults.Poison != nil {
		up := make([]float64, len(delta))
		for i, x := range delta {
			up[i] = float64(x)
		}
		done(copied)
		g.publish(ctx, step, up)
	} else {
		msg, err := g.gs.Encode32(step, delta)
		done(copied)
		if err == nil {
			err = g.gs.PublishEncoded(ctx, step, msg)
		}
		if err != nil && ctx.Err() == nil {
			g.d.Log.Warn("publish failed", "step", step, "err", err)
		}
	}
	for _, v := range held {
		if g.withinNorm(v) {
			g.apply(v, -1)
		}
	}
}

// Merge32 and StepMerge32: gossip updates go to the task as they arrive.
func (g *gossipExchange) Merge32([]float32) int            { return 0 }
func (g *gossipExchange) StepMerge32(int64, []float32) int { return 0 }

// publish sends the step's update on the gossip topic (or, for a node
// playing a poisoner, what faults.Poison makes of it).
func (g *gossipExchange) publish(ctx context.Context, step int64, upd []float64) {
	var err error
	if poison := g.d.Faults.Poison; poison != nil {
		if raw := poison(step, upd); raw != nil {
			err = faults.PublishRaw(g.gs, ctx, raw)
		}
	} else {
		err = g.gs.Publish(ctx, step, upd)
	}
	if err != nil && ctx.Err() == nil {
		g.d.Log.Warn("publish failed", "step", step, "err", err)
	}
}

// Merge does nothing: updates are applied as they arrive (onUpdate).
func (g *gossipExchange) Merge() {}

func (g *gossipExchange) SetStep(step int64) { g.gs.SetLocalStep(step) }

// Restart drops the updates held before the first step: they were for
// the old model.
func (g *gossipExchange) Restart([]float32) {
	g.mu.Lock()
	g.held.take()
	g.mu.Unlock()
}

// model: a gossip node holds no model of its own beside its task's.
func (g *gossipExchange) Model() []float64                   { return nil }
func (g *gossipExchange) ReadModel(int, int, []float32) bool { return false }

// scalesLR: every node adds every update, so the rate is scaled by 1/N̂.
func (g *gossipExchange) ScalesLR() bool { return true }

func (g *gossipExchange) WaitMesh(ctx context.Context) {
	if !g.gs.WaitMesh(ctx) && ctx.Err() == nil {
		g.d.Log.Debug("no gossip mesh peer yet: the first updates may reach no one")
	}
}

// topicWait bounds how long waitSubscribed waits for the update topic to
// list a peer.
const topicWait = 2 * time.Second

// WaitSubscribed waits, up to topicWait, until the gossip topic lists a
// peer, when the node knows any: peers send their updates only to the
// subscribers they know of, and an update sent between the fetch of the
// job's model and the moment peers learn of this node's subscription
// would be missed for good. (Peers without a trainer are not subscribed:
// a node whose known peers have none waits the whole bound.)
func (g *gossipExchange) WaitSubscribed(ctx context.Context) {
	if g.d.Node.PeerCount() == 0 {
		return
	}
	deadline := time.Now().Add(topicWait)
	for len(g.gs.Peers()) == 0 && time.Now().Before(deadline) && ctx.Err() == nil {
		sleepCtx(ctx, 10*time.Millisecond)
	}
}

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

func (g *gossipExchange) Updates() gossip.Stats { return g.gs.Stats() }
func (g *gossipExchange) Topic() *gossip.Gossip { return g.gs }
func (g *gossipExchange) Close() error          { return g.gs.Close() }

// onUpdate applies a validated update from the gossip topic.
func (g *gossipExchange) onUpdate(u gossip.Update) {
	if g.d.Node.OtherLineage(u.Sender) {
		return // a delta of another lineage of the job
	}
	if t32, ok := g.d.Model.(applier32); ok && !u.Encoding.Sparse() {
		g.onUpdate32(u, t32)
		return
	}
	if g.buf == nil { // made at its first use: a float32 task's updates never come here
		g.buf = make([]float64, g.d.Model.NumParams())
	}
	clear(g.buf)
	if err := u.AddTo(g.buf, 1); err != nil {
		add(g.d.Counters.ApplyRejected, 1)
		g.d.Log.Debug("update refused", "from", u.Sender, "step", u.Step, "err", err)
		return
	}
	if !g.withinNorm(g.buf) {
		return
	}
	g.apply(g.buf, u.Step)
	g.heard(u.Sender, u.Step) // an update of a step counts as an answer, and may wake the barrier
}

// onUpdate32 applies a dense update to a float32 task: the norm bound on
// its values, then the task, with no float64 copy. Before the node's
// first step it takes the float64 path (held, then judged).
func (g *gossipExchange) onUpdate32(u gossip.Update, t applier32) {
	if g.cfg.NormBound > 0 {
		g.mu.Lock()
		med, ok := g.norms.reference()
		g.mu.Unlock()
		if !ok {
			v := make([]float64, len(u.Values))
			for i, x := range u.Values {
				v[i] = float64(x)
			}
			g.withinNorm(v) // holds it
			return
		}
		if nrm := f32.Norm(u.Values); nrm > g.cfg.NormBound*med {
			g.refusedNorm(u.Sender, nrm, g.cfg.NormBound*med)
			return
		}
	}
	if err := t.Apply32(u.Values, u.Step, 1); err != nil {
		add(g.d.Counters.ApplyRejected, 1)
		g.d.Log.Debug("update refused by the model", "err", err)
		return
	}
	add(g.d.Counters.Applied, 1)
	g.heard(u.Sender, u.Step) // an update of a step counts as an answer, and may wake the barrier
}

// apply adds a received update, made at step from (-1: not known), to
// the model.
func (g *gossipExchange) apply(v []float64, from int64) {
	if err := g.d.Model.Apply(v); err != nil {
		add(g.d.Counters.ApplyRejected, 1)
		g.d.Log.Debug("update refused by the model", "err", err)
		return
	}
	add(g.d.Counters.Applied, 1)
	if from >= 0 {
		observe(g.d.Counters.Staleness, float64(g.d.Node.Step()-from))
	}
}

// noteOwnNorm records the norm of an update this node computed itself and,
// after the node's first step, checks and applies the updates that arrived
// before it had a reference norm.
func (g *gossipExchange) noteOwnNorm(delta []float64) {
	g.mu.Lock()
	if !g.norms.note(delta) {
		g.mu.Unlock()
		return
	}
	held := g.held.take()
	g.mu.Unlock()
	for _, v := range held {
		if g.withinNorm(v) {
			g.apply(v, -1)
		}
	}
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
func (g *gossipExchange) withinNorm(v []float64) bool {
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
	if nrm := l2(v); nrm > g.cfg.NormBound*med {
		g.refusedNorm("", nrm, g.cfg.NormBound*med)
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
