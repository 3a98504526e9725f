package node

import "github.com/pspnode/pspnode/node/status"

// Traffic returns what the node's streams carried since it started
// (status.Meter counts them).
func (n *Node) Traffic() status.Traffic {
	return n.meter.Traffic(n.started, n.step.Load(), topicPayloadBytes(n.Gossip()))
}
