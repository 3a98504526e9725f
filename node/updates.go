package node

import (
	"context"
	"math"
	"slices"
	"time"

	"github.com/pspnode/pspnode/gossip"
	"github.com/pspnode/pspnode/internal/faults"
)

// pushUpdate hands the step's update to the exchange: under gossip it is
// published on the topic; under epidemic the node's model goes to S
// sampled peers (exchange.go). upd is nil for a task without a model.
func (n *Node) pushUpdate(ctx context.Context, step int64, upd []float64) {
	if n.ex != nil {
		if upd != nil {
			n.noteOwnNorm(upd)
		}
		n.sendModel(step)
		n.releaseHeld()
		return
	}
	if n.gs == nil {
		return
	}
	n.gs.SetLocalStep(step)
	if upd != nil {
		n.noteOwnNorm(upd)
		n.publish(ctx, step, upd)
	}
}

// publish sends the step's update on the gossip topic (or, for a node
// playing a poisoner, what faults.Poison makes of it).
func (n *Node) publish(ctx context.Context, step int64, upd []float64) {
	var err error
	if poison := n.cfg.faults.Poison; poison != nil {
		if raw := poison(step, upd); raw != nil {
			err = faults.PublishRaw(n.gs, ctx, raw)
		}
	} else {
		err = n.gs.Publish(ctx, step, upd)
	}
	if err != nil && ctx.Err() == nil {
		n.log.Warn("publish failed", "step", step, "err", err)
	}
}

// onUpdate applies a validated update from the gossip topic.
func (n *Node) onUpdate(u gossip.Update) {
	if n.lin.fromYounger(u.Sender, time.Now()) {
		n.lin.otherUpdates.Inc() // a delta of another model's lineage (genesis.go)
		return
	}
	clear(n.updBuf)
	if err := u.AddTo(n.updBuf, 1); err != nil {
		n.m.applyRejected.Inc()
		n.log.Debug("update refused", "from", u.Sender, "step", u.Step, "err", err)
		return
	}
	if !n.withinNorm(n.updBuf) {
		return
	}
	n.apply(n.updBuf)
	n.progress.saw(u.Sender, u.Step)
	if u.Step <= n.step.Load() {
		n.poke() // a peer at or behind us progressed: a waiting barrier may pass now
	}
}

// apply adds a received update to the model.
func (n *Node) apply(v []float64) {
	if err := n.task.Apply(v); err != nil {
		n.m.applyRejected.Inc()
		n.log.Debug("update refused by the model", "err", err)
		return
	}
	n.m.applied.Inc()
}

// noteOwnNorm records the norm of an update this node computed itself and,
// after the node's first step, checks and applies the updates that arrived
// before it had a reference norm.
func (n *Node) noteOwnNorm(delta []float64) {
	nrm := l2(delta)
	if !(nrm > 0) || math.IsInf(nrm, 0) {
		return
	}
	n.normMu.Lock()
	n.ownNorms.add(nrm)
	held := n.held
	n.held, n.heldBytes = nil, 0
	n.normMu.Unlock()
	for _, v := range held {
		if n.withinNorm(v) {
			n.apply(v)
		}
	}
}

// maxHeldBytes caps the updates a node holds before its first step.
const maxHeldBytes = 8 << 20

// withinNorm reports whether a received update v is within NormBound × the
// median norm of this node's own recent updates, and counts it if not.
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
func (n *Node) withinNorm(v []float64) bool {
	if n.cfg.NormBound <= 0 {
		return true
	}
	n.normMu.Lock()
	norms := n.ownNorms.values()
	if len(norms) == 0 {
		if n.heldBytes+8*len(v) <= maxHeldBytes {
			n.held = append(n.held, slices.Clone(v))
			n.heldBytes += 8 * len(v)
			n.normMu.Unlock()
			return false
		}
		n.normMu.Unlock()
		n.m.normRefused.Inc()
		return false
	}
	n.normMu.Unlock()
	slices.Sort(norms)
	if l2(v) <= n.cfg.NormBound*norms[len(norms)/2] {
		return true
	}
	n.m.normRefused.Inc()
	return false
}

func l2(v []float64) float64 {
	var s float64
	for _, x := range v {
		s += x * x
	}
	return math.Sqrt(s)
}
