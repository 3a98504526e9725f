package node

import (
	"cmp"
	"slices"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
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
	n.m.connsTrimmed.Add(float64(k))
	return k
}
