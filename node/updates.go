package node

import (
	"context"
)

// publish sends the step's update on the gossip topic (or, for a node
// playing a poisoner, what Faults.Poison makes of it).
func (n *Node) publish(ctx context.Context, step int64, upd []float64) {
	var err error
	if poison := n.cfg.Faults.Poison; poison != nil {
		if raw := poison(step, upd); raw != nil {
			err = n.gs.PublishRaw(ctx, raw)
		}
	} else {
		err = n.gs.Publish(ctx, step, upd)
	}
	if err != nil && ctx.Err() == nil {
		n.log.Warn("publish failed", "step", step, "err", err)
	}
}
