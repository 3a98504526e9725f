package wire

import (
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
)

// ByteBudget bounds the bytes a node serves over one protocol in a
// minute, per peer and in all, in units of what the protocol serves (a
// model's or a state's size): a peer's small requests then make the node
// send at most PerPeer units a minute, whatever they ask, and all peers
// together All. A request is charged before its bytes go out (Take) and
// settled with what it sent (Settle). The zero value refuses everything;
// make one with NewByteBudget.
type ByteBudget struct {
	perPeer, all float64

	mu     sync.Mutex
	window time.Time // the minute the budgets count
	used   map[peer.ID]uint64
	total  uint64
}

// NewByteBudget serves perPeer units a minute to each peer, all in all.
func NewByteBudget(perPeer, all float64) *ByteBudget {
	return &ByteBudget{perPeer: perPeer, all: all, used: make(map[peer.ID]uint64)}
}

// Take charges n bytes to p's budget of this minute, unit the size the
// budget counts in; false (nothing charged) if p's or the node's would be
// spent.
func (b *ByteBudget) Take(p peer.ID, n, unit uint64, now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.used == nil {
		return false
	}
	if now.Sub(b.window) >= time.Minute {
		b.window, b.total = now, 0
		clear(b.used)
	}
	if float64(b.used[p]+n) > b.perPeer*float64(unit) || float64(b.total+n) > b.all*float64(unit) {
		return false
	}
	b.used[p] += n
	b.total += n
	return true
}

// Settle makes what p was charged (took) what the request cost (cost): it
// gives back what was not sent, or charges what was sent beyond.
func (b *ByteBudget) Settle(p peer.ID, took, cost uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.used == nil {
		return
	}
	if cost >= took {
		b.used[p] += cost - took
		b.total += cost - took
		return
	}
	b.used[p] -= min(took-cost, b.used[p])
	b.total -= min(took-cost, b.total)
}
