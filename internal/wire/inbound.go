package wire

import (
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
)

// Inbound model streams have caps of their own, apart from the step
// protocol's: a model stream may rightly last 10 × QueryTimeout (a large
// model, a trainer slow to give its parameters), so 64 peers holding 8
// slow model streams each filled the 512 slots the two protocols shared,
// every step query was refused, and the askers took the node for dead. A
// joiner fetches one model at a time, from one peer at a time.
const (
	ModelStreamsPerPeer = 2
	ModelStreamsTotal   = 64
)

// Inbound caps the concurrent inbound streams of one protocol (the
// step, model and exchange protocols each have one), per remote peer and
// in total, so that a peer that floods a node with streams gets them reset
// at once instead of tying up handler goroutines and memory. It works on
// every transport (go-libp2p's resource manager, which real hosts also
// configure, is absent from the in-memory testnet transport).
//
// The step protocol's limiter also evicts (Enter, Leave): a step stream
// spends most of its life idle, waiting for its asker's next query (or its
// first), and peers that opened streams only to hold them idle filled every
// slot, so that the node refused its known peers' queries and they took it
// for dead (80 peers holding 8 each: 8 of 8 honest queries reset). When
// the total cap is reached, a new stream takes the slot of an idle one:
// of a peer the node does not know (Overlay.Knows: heard from first-hand)
// when the newcomer is known, or of a peer holding at least two streams
// more than the newcomer; the unknown first, then the peer holding the
// most, then the longest idle. A peer holding many streams therefore
// loses them to any peer holding few, and a known peer's only stream is
// never taken by one that holds none; a newcomer that can take no slot is
// refused as before.
type Inbound struct {
	perPeer, total int

	mu     sync.Mutex
	active map[peer.ID]int
	sum    int
	// known, once set (SetKnown), makes the limiter evict idle streams
	// (Enter); idle holds the idle ones.
	known func(peer.ID) bool
	idle  map[*Slot]struct{}
}

// NewInbound caps inbound streams at perPeer per peer and total in all.
func NewInbound(perPeer, total int) *Inbound {
	return &Inbound{perPeer: perPeer, total: total, active: make(map[peer.ID]int)}
}

// Slot is one inbound stream held under an evicting limiter.
type Slot struct {
	p       peer.ID
	s       network.Stream
	idle    bool
	since   time.Time // when it last became idle
	evicted bool      // reset to make room for another: no longer counted
}

// SetKnown makes l evict idle streams when full, judging peers by known.
func (l *Inbound) SetKnown(known func(peer.ID) bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.known = known
	if l.idle == nil {
		l.idle = make(map[*Slot]struct{})
	}
}

// Enter reserves a slot for stream s from p, idle (waiting for its first
// request); when the total cap is reached it evicts an idle stream if the
// rules above let it, and resets that stream. false: p is at its cap, or
// no stream may be evicted. A successful Enter must be followed by Leave;
// the stream's handler marks it busy while it serves a request (busy).
// evicted is told of each stream reset to make room.
func (l *Inbound) Enter(p peer.ID, s network.Stream, evicted func()) (*Slot, bool) {
	now := time.Now()
	l.mu.Lock()
	if l.active[p] >= l.perPeer {
		l.mu.Unlock()
		return nil, false
	}
	var victim *Slot
	if l.sum >= l.total {
		if l.known != nil {
			victim = l.victimLocked(p)
		}
		if victim == nil {
			l.mu.Unlock()
			return nil, false
		}
		victim.evicted = true
		delete(l.idle, victim)
		l.releaseLocked(victim.p)
	}
	sl := &Slot{p: p, s: s, idle: true, since: now}
	l.active[p]++
	l.sum++
	if l.idle != nil {
		l.idle[sl] = struct{}{}
	}
	l.mu.Unlock()
	if victim != nil {
		_ = victim.s.Reset()
		evicted()
	}
	return sl, true
}

// victimLocked picks the idle stream a new stream from p may take (see
// Inbound), or nil. l.mu is held.
func (l *Inbound) victimLocked(p peer.ID) *Slot {
	knownCache := make(map[peer.ID]bool)
	isKnown := func(q peer.ID) bool {
		k, ok := knownCache[q]
		if !ok {
			k = l.known(q)
			knownCache[q] = k
		}
		return k
	}
	newcomerKnown := isKnown(p)
	var best *Slot
	var bestUnknown bool
	for sl := range l.idle {
		if sl.p == p {
			continue
		}
		unknown := !isKnown(sl.p)
		if !(newcomerKnown && unknown) && l.active[sl.p] < l.active[p]+2 {
			continue
		}
		switch {
		case best == nil:
		case unknown != bestUnknown:
			if !unknown {
				continue
			}
		case l.active[sl.p] != l.active[best.p]:
			if l.active[sl.p] < l.active[best.p] {
				continue
			}
		case !sl.since.Before(best.since):
			continue
		}
		best, bestUnknown = sl, unknown
	}
	return best
}

// busy marks sl as serving a request (it cannot be evicted), or idle
// again.
func (l *Inbound) busy(sl *Slot, busy bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if sl.evicted || l.idle == nil {
		return
	}
	sl.idle = !busy
	if busy {
		delete(l.idle, sl)
	} else {
		sl.since = time.Now()
		l.idle[sl] = struct{}{}
	}
}

// Leave releases sl's slot, unless it was evicted (its slot went to the
// stream that evicted it).
func (l *Inbound) Leave(sl *Slot) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if sl.evicted {
		return
	}
	if l.idle != nil {
		delete(l.idle, sl)
	}
	l.releaseLocked(sl.p)
}

// Acquire reserves a slot for a stream from p; false if p or the node is at
// its limit. A successful Acquire must be followed by Release.
func (l *Inbound) Acquire(p peer.ID) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.active[p] >= l.perPeer || l.sum >= l.total {
		return false
	}
	l.active[p]++
	l.sum++
	return true
}

// roomy reports whether the node holds fewer than half its cap of inbound
// streams: only then does a step stream stay open for another exchange.
func (l *Inbound) roomy() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return 2*l.sum < l.total
}

func (l *Inbound) Release(p peer.ID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.releaseLocked(p)
}

func (l *Inbound) releaseLocked(p peer.ID) {
	if l.active[p]--; l.active[p] <= 0 {
		delete(l.active, p)
	}
	l.sum--
}

// Inbound exchange streams have caps of their own, apart from the step
// and model protocols', so that models cannot crowd out step queries.
const (
	ExchangeStreamsPerPeer = 2
	ExchangeStreamsTotal   = 64
)
