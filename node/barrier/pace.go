package barrier

import (
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/pspnode/pspnode/psp"
)

// The paces the barrier learns of its peers (psp.Pace, the pace rule of
// pBSP and pSSP) are the barrier goroutine's; each check that ends copies
// those of the peers it observed here, for other goroutines (an exchange
// weighing a peer's model by how slow the peer is) to read with PeerPace.

// PeerPace is what the node's barrier learnt of one peer's pace.
type PeerPace struct {
	// Interval is the peer's seconds per step as the pace rule reads it
	// (psp.Pace.Interval); Reference the node's own (psp.Pace.Reference).
	Interval, Reference float64
	// Slow: the peer steps more than the rule's factor times slower than
	// the node, so the node's barrier does not wait for it.
	Slow bool
	// At is when the barrier last observed the peer.
	At time.Time
}

// Steps is how many of the node's steps one of the peer's takes (0 when
// either is unknown): a model from the peer that is k of its own steps
// old is about k·Steps of the node's steps old.
func (p PeerPace) Steps() float64 {
	if p.Interval <= 0 || p.Reference <= 0 {
		return 0
	}
	return p.Interval / p.Reference
}

// paceBookCap bounds the peers a node keeps paces of; at the cap the
// least recently observed goes.
const paceBookCap = 4096

// paceBook is the node's copy of its barrier's peer paces.
type paceBook struct {
	mu sync.Mutex
	m  map[peer.ID]PeerPace
}

// PeerPace is what the barrier learnt of p's pace; false while it has
// learnt nothing (it has no pace rule, or has not observed p at two
// steps).
func (b *Barrier) PeerPace(p peer.ID) (PeerPace, bool) {
	b.paces.mu.Lock()
	defer b.paces.mu.Unlock()
	pp, ok := b.paces.m[p]
	return pp, ok
}

// note copies the paces of the peers the check that just ended
// observed. Only the barrier's goroutine calls it.
func (b *paceBook) note(ck *psp.Checker, now float64) {
	pc := ck.Pace()
	if pc == nil {
		return
	}
	obs := ck.Observations()
	if len(obs) == 0 {
		return
	}
	ref, factor, at := pc.Reference(), pc.Config().Factor, time.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.m == nil {
		b.m = make(map[peer.ID]PeerPace)
	}
	for _, o := range obs {
		iv := pc.Interval(o.Peer, now)
		if iv <= 0 {
			continue
		}
		id := peer.ID(o.Peer)
		if _, ok := b.m[id]; !ok && len(b.m) >= paceBookCap {
			b.evictOldest()
		}
		b.m[id] = PeerPace{Interval: iv, Reference: ref, Slow: ref > 0 && iv > factor*ref, At: at}
	}
}

// evictOldest drops the least recently observed peer. b.mu is held.
func (b *paceBook) evictOldest() {
	var oldest peer.ID
	var at time.Time
	for id, pp := range b.m {
		if at.IsZero() || pp.At.Before(at) {
			oldest, at = id, pp.At
		}
	}
	delete(b.m, oldest)
}

// forget drops p's pace (it left, or failed).
func (b *paceBook) forget(p peer.ID) {
	b.mu.Lock()
	delete(b.m, p)
	b.mu.Unlock()
}
