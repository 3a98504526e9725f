package node

import (
	"time"

	"github.com/pspnode/pspnode/node/netsetup"
	"github.com/pspnode/pspnode/node/status"
)

// The node bounds its connections (Config.Limits.BoundConns: at most ConnHigh,
// trimmed to ConnLow) and guards the last quarter of a built host's
// inbound limit; how, and why, is in netsetup's limits.go.

// boundConns starts the trimming loop; it ends with the node's life.
func (n *Node) boundConns() {
	if !n.cfg.Limits.BoundConns || n.cfg.Limits.ConnHigh <= 0 {
		return
	}
	go n.every(netsetup.TrimEvery, func() { n.trimConns(time.Now()) })
}

// trimConns trims the host to ConnLow if it holds more than ConnHigh, and
// counts what it closed.
func (n *Node) trimConns(now time.Time) int {
	k := netsetup.TrimConns(n.h, now, n.cfg.Limits.ConnLow, n.cfg.Limits.ConnHigh)
	n.m.ConnsTrimmed.Add(float64(k))
	n.m.Hostile.WithLabelValues(status.KindIdleInboundClosed).Add(float64(k))
	return k
}

// guardInbound starts the inbound guard of a host the node built; it ends
// with the node's life.
func (n *Node) guardInbound() {
	if n.inboundLimit <= 0 {
		return
	}
	go func() {
		for {
			select {
			case <-n.life.Done():
				return
			case <-n.guardKick:
			}
			n.trimInbound(time.Now(), n.inboundLimit)
			sleepCtx(n.life, netsetup.GuardPause)
		}
	}()
}

// trimInbound runs the inbound guard once, and counts what it closed.
func (n *Node) trimInbound(now time.Time, limit int) int {
	k := netsetup.TrimInbound(n.h, now, limit)
	n.m.ConnsTrimmed.Add(float64(k))
	return k
}

// every calls fn every period until the node's life ends: the loop of the
// node's periodic background chores, run on a goroutine of its own.
func (n *Node) every(period time.Duration, fn func()) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-n.life.Done():
			return
		case <-t.C:
			fn()
		}
	}
}
