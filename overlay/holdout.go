package overlay

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
)

// maxHeldOut bounds the peers held out at once; beyond it a peer to hold
// out is only marked dead (it may come back on evidence of life).
const maxHeldOut = 4096

// heldOut is the set of peers held out of the overlay (HoldOut). It has a
// lock of its own: the DHT's routing-table filter asks it from the DHT's
// goroutines, which must not wait on the overlay's lock.
type heldOut struct {
	n    atomic.Int32 // len(peer): most nodes hold no one out, and ask on every sighting
	mu   sync.Mutex
	peer map[peer.ID]struct{}
}

func newHeldOut() *heldOut { return &heldOut{peer: make(map[peer.ID]struct{})} }

func (h *heldOut) has(p peer.ID) bool {
	if h.n.Load() == 0 {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	_, ok := h.peer[p]
	return ok
}

// add holds p out; false if the set is full.
func (h *heldOut) add(p peer.ID) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.peer[p]; !ok && len(h.peer) >= maxHeldOut {
		return false
	}
	h.peer[p] = struct{}{}
	h.n.Store(int32(len(h.peer)))
	return true
}

// remove lets p back; it reports whether p was held out.
func (h *heldOut) remove(p peer.ID) bool {
	if h.n.Load() == 0 {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	_, ok := h.peer[p]
	delete(h.peer, p)
	h.n.Store(int32(len(h.peer)))
	return ok
}

func (h *heldOut) len() int { return int(h.n.Load()) }

// routingFilter is the DHT's routing-table filter: a peer held out does
// not enter the routing table.
func (h *heldOut) routingFilter(_ any, p peer.ID) bool { return !h.has(p) }

// HoldOut keeps p out of this node's view of the job until Readmit: a peer
// that answers but must not count, such as one that runs another model.
// It leaves the sampler, the pool, the known population, the population
// reports and the routing table at once, as MarkDead does, but unlike a
// dead peer no evidence of life brings it back: it is not drawn, not
// counted, not re-added to the routing table, and not used by the
// order-statistics estimate. At most 4096 peers are held out; beyond,
// HoldOut only marks the peer dead.
func (o *Overlay) HoldOut(p peer.ID) {
	if p == o.h.ID() || p == "" {
		return
	}
	o.held.add(p)
	o.mu.Lock()
	defer o.mu.Unlock()
	if m, ok := o.members[p]; ok {
		o.markDeadLocked(m, time.Now(), "held out")
	}
	delete(o.reports, p)
	o.dht.RoutingTable().RemovePeer(p)
}

// Readmit lets a peer held out back in: it returns on its next evidence of
// life, as a dead peer does. It reports whether p was held out.
func (o *Overlay) Readmit(p peer.ID) bool { return o.held.remove(p) }

// HeldOut reports whether p is held out.
func (o *Overlay) HeldOut(p peer.ID) bool { return o.held.has(p) }

// HeldOutCount is the number of peers held out.
func (o *Overlay) HeldOutCount() int { return o.held.len() }
