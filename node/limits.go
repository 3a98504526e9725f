package node

import (
	"sync"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	rcmgr "github.com/libp2p/go-libp2p/p2p/host/resource-manager"

	"github.com/pspnode/pspnode/internal/wire"
)

// resourceManager is go-libp2p's default resource manager (limits scaled to
// the machine's memory and file descriptors) plus per-peer stream caps on
// the job's step, model and exchange protocols, so that one peer cannot hold more
// than MaxStreamsPerPeer of either open at the transport level.
func resourceManager(cfg Config) (network.ResourceManager, error) {
	limits := rcmgr.DefaultLimits
	libp2p.SetDefaultServiceLimits(&limits)
	k := cfg.MaxStreamsPerPeer
	perPeer := rcmgr.BaseLimit{Streams: 2 * k, StreamsInbound: k, StreamsOutbound: k, Memory: 16 << 20}
	limits.AddProtocolPeerLimit(wire.StepProtocol(cfg.Job), perPeer, rcmgr.BaseLimitIncrease{})
	limits.AddProtocolPeerLimit(wire.StepProtocolExt(cfg.Job), perPeer, rcmgr.BaseLimitIncrease{})
	limits.AddProtocolPeerLimit(wire.ModelProtocol(cfg.Job), perPeer, rcmgr.BaseLimitIncrease{})
	limits.AddProtocolPeerLimit(ExchangeProtocol(cfg.Job), perPeer, rcmgr.BaseLimitIncrease{})
	return rcmgr.NewResourceManager(rcmgr.NewFixedLimiter(limits.AutoScale()))
}

// Inbound model streams have caps of their own, apart from the step
// protocol's: a model stream may rightly last 10 × QueryTimeout (a large
// model, a trainer slow to give its parameters), so 64 peers holding 8
// slow model streams each filled the 512 slots the two protocols shared,
// every step query was refused, and the askers took the node for dead. A
// joiner fetches one model at a time, from one peer at a time.
const (
	modelStreamsPerPeer = 2
	modelStreamsTotal   = 64
)

// inboundLimiter caps the concurrent inbound streams of one protocol (the
// step, model and exchange protocols each have one), per remote peer and
// in total, so that a peer that floods a node with streams gets them reset
// at once instead of tying up handler goroutines and memory. It works on
// every transport (go-libp2p's resource manager, which real hosts also
// configure, is absent from the in-memory testnet transport).
type inboundLimiter struct {
	perPeer, total int

	mu     sync.Mutex
	active map[peer.ID]int
	sum    int
}

func newInboundLimiter(perPeer, total int) *inboundLimiter {
	return &inboundLimiter{perPeer: perPeer, total: total, active: make(map[peer.ID]int)}
}

// acquire reserves a slot for a stream from p; false if p or the node is at
// its limit. A successful acquire must be followed by release.
func (l *inboundLimiter) acquire(p peer.ID) bool {
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
func (l *inboundLimiter) roomy() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return 2*l.sum < l.total
}

func (l *inboundLimiter) release(p peer.ID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.active[p]--; l.active[p] <= 0 {
		delete(l.active, p)
	}
	l.sum--
}
