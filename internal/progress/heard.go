package progress

import (
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
)

// Heard is the peers a node heard from (they answered a step query or
// sent one), and when, less those that said they leave: what tells a
// node cut off from its peers from one whose peers are gone (package
// node's isolation.go). Safe for concurrent use; the zero value is empty.
type Heard struct {
	mu     sync.Mutex
	at     map[peer.ID]time.Time // peers heard from, when last; not those that left
	leftAt time.Time             // the last leave notice or leaving reply
}

// maxHeard bounds the peers remembered; beyond it the older half goes.
const maxHeard = 8192

// Note records that peers were heard from at now; hold is how long one
// counts (Lately), of which a full map keeps the last half. It returns
// those of peers it did not hold: heard from for the first time lately.
func (h *Heard) Note(now time.Time, hold time.Duration, peers ...peer.ID) (fresh []peer.ID) {
	if len(peers) == 0 {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.at == nil {
		h.at = make(map[peer.ID]time.Time)
	}
	for _, p := range peers {
		at, ok := h.at[p]
		if !ok || now.Sub(at) > hold {
			fresh = append(fresh, p)
		}
		if !ok && len(h.at) >= maxHeard {
			h.forgetLocked(now, hold/2)
			if len(h.at) >= maxHeard {
				clear(h.at)
			}
		}
		h.at[p] = now
	}
	return fresh
}

// Left forgets p: it said it leaves (at now), so its absence is no
// failure. LastLeave then says when.
func (h *Heard) Left(p peer.ID, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.at, p)
	h.leftAt = now
}

// Forget forgets p without counting a departure (a peer held out for
// running another model).
func (h *Heard) Forget(p peer.ID) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.at, p)
}

// LastLeave is when a peer last said it leaves (zero: never).
func (h *Heard) LastLeave() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.leftAt
}

// Lately reports whether a peer that has not left was heard from within
// hold of now (and forgets those heard from before).
func (h *Heard) Lately(now time.Time, hold time.Duration) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.forgetLocked(now, hold)
	return len(h.at) > 0
}

// forgetLocked forgets the peers last heard from more than hold before
// now; h.mu is held.
func (h *Heard) forgetLocked(now time.Time, hold time.Duration) {
	cut := now.Add(-hold)
	for p, at := range h.at {
		if at.Before(cut) {
			delete(h.at, p)
		}
	}
}
