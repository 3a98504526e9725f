package node

import (
	"cmp"
	"slices"
	"time"

	"github.com/libp2p/go-libp2p/core/network"

	"github.com/pspnode/pspnode/node/status"
)

// Connection bound. Every connection costs a file descriptor, buffers and
// keep-alives, so a node holds at most Config.ConnHigh of them whatever
// the population. libp2p's basic connection manager does not bound them:
// it trims only the connections that are neither protected nor younger
// than its grace period, and only down to ConnLow of those, so the
// protected ones (the sampler pool both ways, the estimator's zone, the
// gossip mesh) and every connection opened within the grace period come
// on top. A node sampling its step queries from 200 peers held about 155
// connections with watermarks 32/96.
//
// So the node can trim its host itself (Config.BoundConns; any host, its
// own or one given with WithHost): every connTrimEvery, once it holds more than ConnHigh
// connections, it closes unprotected ones until it holds ConnLow, those
// with the fewest open streams first (idle ones before ones that may
// carry a query), then the oldest, none younger than connMinAge (a
// connection just dialled for a query or a lookup gets to carry it).
// What the barrier needs is protected by the overlay and the gossip
// layer: the pool, whose connections show departures at once, the
// peers whose pools hold this node, the zone the estimator counts, and
// the mesh. A sampled peer with no connection costs a dial, counted in
// psp_step_dials_total (Status.StepDials).
const (
	connTrimEvery = time.Second
	connMinAge    = 2 * time.Second
)

// boundConns starts the trimming loop; it ends with the node's life.
func (n *Node) boundConns() {
	if !n.cfg.BoundConns || n.cfg.ConnHigh <= 0 {
		return
	}
	go n.every(connTrimEvery, func() { n.trimConns(time.Now()) })
}

// trimConns closes unprotected connections down to ConnLow if the host
// holds more than ConnHigh, and returns how many it closed.
func (n *Node) trimConns(now time.Time) int {
	conns := n.h.Network().Conns()
	if len(conns) <= n.cfg.ConnHigh {
		return 0
	}
	cm := n.h.ConnManager()
	type cand struct {
		c       network.Conn
		streams int
		opened  time.Time
	}
	var cands []cand
	for _, c := range conns {
		opened := c.Stat().Opened
		if now.Sub(opened) < connMinAge || cm.IsProtected(c.RemotePeer(), "") {
			continue
		}
		cands = append(cands, cand{c, len(c.GetStreams()), opened})
	}
	slices.SortFunc(cands, func(a, b cand) int {
		return cmp.Or(cmp.Compare(a.streams, b.streams), a.opened.Compare(b.opened))
	})
	k := min(len(conns)-n.cfg.ConnLow, len(cands))
	for _, c := range cands[:k] {
		_ = c.c.CloseWithError(network.ConnGarbageCollected)
	}
	n.m.ConnsTrimmed.Add(float64(k))
	n.m.Hostile.WithLabelValues(status.KindIdleInboundClosed).Add(float64(k))
	return k
}

// The inbound guard keeps the last quarter of a built host's inbound
// connection limit free (limits.go): when a connection comes in and the
// host holds more than three quarters of the limit inbound, it closes
// inbound connections that carry no stream, are older than connMinAge and
// that the connection manager does not protect (the overlay protects the
// peers it needs: its sampler pool, the peers whose pools hold this node,
// its zone), oldest first, down to half the limit; at most once per
// guardPause. Idle peers that hold connections only to fill the limit
// are closed as they pile up, long before it refuses a new peer.
const guardPause = 100 * time.Millisecond

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
			sleepCtx(n.life, guardPause)
		}
	}()
}

// trimInbound closes idle unprotected inbound connections down to half
// the inbound limit if the host holds more than three quarters of it, and
// returns how many it closed.
func (n *Node) trimInbound(now time.Time, limit int) int {
	var in []network.Conn
	for _, c := range n.h.Network().Conns() {
		if c.Stat().Direction == network.DirInbound {
			in = append(in, c)
		}
	}
	if 4*len(in) <= 3*limit {
		return 0
	}
	cm := n.h.ConnManager()
	var cands []network.Conn
	for _, c := range in {
		if len(c.GetStreams()) == 0 && now.Sub(c.Stat().Opened) >= connMinAge && !cm.IsProtected(c.RemotePeer(), "") {
			cands = append(cands, c)
		}
	}
	slices.SortFunc(cands, func(a, b network.Conn) int { return a.Stat().Opened.Compare(b.Stat().Opened) })
	k := min(len(in)-limit/2, len(cands))
	for _, c := range cands[:k] {
		_ = c.CloseWithError(network.ConnGarbageCollected)
	}
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
