package node

import (
	"sync"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	rcmgr "github.com/libp2p/go-libp2p/p2p/host/resource-manager"

	"github.com/pspnode/pspnode/internal/wire"
)

// Connection limits of a host the node builds. go-libp2p's resource
// manager scales its limits to the machine: on one of 24 GiB it admitted
// 252 inbound connections, and 79 still in their security handshake (its
// transient scope), each for up to 15 s. The connection manager's high
// watermark (ConnHigh, 256) was above the first: 250 idle peers connected
// and never trimmed (the manager trims only above 256) refused every new
// peer, and 85 half-open TCP sockets did too. On a public address
// go-libp2p also caps the connections of one IPv4 address at 8 (of an
// IPv6 /56 at 16), but not on loopback or between the addresses of one
// machine.
//
// So the node raises the inbound limits to minInboundConns (or what the
// machine's file descriptors allow: half of the manager's share of them),
// the transient scope's to half that, and keeps its watermarks at most a
// quarter of the inbound limit: the connection manager trims idle peers
// long before the limit is near. And the inbound guard (connbound.go)
// closes idle, unprotected inbound connections once inbound connections
// pass three quarters of the limit, so that the last quarter stays free
// for new peers and the peers the node needs.
const minInboundConns = 1024

// connLimits are the connection limits of a host the node builds.
type connLimits struct {
	inbound   int // the resource manager's inbound connection limit
	low, high int // the connection manager's watermarks
}

// resourceManager is go-libp2p's default resource manager (limits scaled to
// the machine's memory and file descriptors) with the inbound connection
// limits above, plus per-peer stream caps on the job's step, model and
// exchange protocols, so that one peer cannot hold more than
// MaxStreamsPerPeer of either open at the transport level. It returns the
// limits the node's connection manager and inbound guard must keep to.
func resourceManager(cfg Config) (network.ResourceManager, connLimits, error) {
	limits := rcmgr.DefaultLimits
	libp2p.SetDefaultServiceLimits(&limits)
	k := cfg.MaxStreamsPerPeer
	perPeer := rcmgr.BaseLimit{Streams: 2 * k, StreamsInbound: k, StreamsOutbound: k, Memory: 16 << 20}
	limits.AddProtocolPeerLimit(wire.StepProtocol(cfg.Job), perPeer, rcmgr.BaseLimitIncrease{})
	limits.AddProtocolPeerLimit(wire.StepProtocolExt(cfg.Job), perPeer, rcmgr.BaseLimitIncrease{})
	limits.AddProtocolPeerLimit(wire.ModelProtocol(cfg.Job), perPeer, rcmgr.BaseLimitIncrease{})
	limits.AddProtocolPeerLimit(ExchangeProtocol(cfg.Job), perPeer, rcmgr.BaseLimitIncrease{})
	concrete, cl := raiseConnLimits(limits.AutoScale(), cfg.ConnLow, cfg.ConnHigh)
	rm, err := rcmgr.NewResourceManager(rcmgr.NewFixedLimiter(concrete))
	return rm, cl, err
}

// raiseConnLimits raises auto's inbound connection limits as the comment
// above says, and returns them with the watermarks low and high clamped to
// a quarter of the inbound limit.
func raiseConnLimits(auto rcmgr.ConcreteLimitConfig, low, high int) (rcmgr.ConcreteLimitConfig, connLimits) {
	p := auto.ToPartialLimitConfig()
	sys, tr := &p.System, &p.Transient
	inbound := max(int(sys.ConnsInbound), minInboundConns)
	if fd := int(sys.FD); fd > 0 {
		inbound = max(min(inbound, fd/2), int(sys.ConnsInbound)) // never below go-libp2p's own
	}
	sys.ConnsInbound = rcmgr.LimitVal(inbound)
	sys.Conns = max(sys.Conns, rcmgr.LimitVal(2*inbound))
	tr.ConnsInbound = max(tr.ConnsInbound, rcmgr.LimitVal(inbound/2))
	tr.Conns = max(tr.Conns, rcmgr.LimitVal(inbound))
	tr.FD = max(tr.FD, rcmgr.LimitVal(inbound/2))
	cl := connLimits{inbound: inbound, low: low, high: high}
	if q := inbound / 4; cl.high > q {
		cl.high = q
	}
	cl.low = min(cl.low, cl.high)
	return p.Build(auto), cl
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
//
// The step protocol's limiter also evicts (enter, leave): a step stream
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
type inboundLimiter struct {
	perPeer, total int

	mu     sync.Mutex
	active map[peer.ID]int
	sum    int
	// known, once set (setKnown), makes the limiter evict idle streams
	// (enter); idle holds the idle ones.
	known func(peer.ID) bool
	idle  map[*stepSlot]struct{}
}

func newInboundLimiter(perPeer, total int) *inboundLimiter {
	return &inboundLimiter{perPeer: perPeer, total: total, active: make(map[peer.ID]int)}
}

// stepSlot is one inbound stream held under an evicting limiter.
type stepSlot struct {
	p       peer.ID
	s       network.Stream
	idle    bool
	since   time.Time // when it last became idle
	evicted bool      // reset to make room for another: no longer counted
}

// setKnown makes l evict idle streams when full, judging peers by known.
func (l *inboundLimiter) setKnown(known func(peer.ID) bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.known = known
	if l.idle == nil {
		l.idle = make(map[*stepSlot]struct{})
	}
}

// enter reserves a slot for stream s from p, idle (waiting for its first
// request); when the total cap is reached it evicts an idle stream if the
// rules above let it, and resets that stream. false: p is at its cap, or
// no stream may be evicted. A successful enter must be followed by leave;
// the stream's handler marks it busy while it serves a request (busy).
// evicted is told of each stream reset to make room.
func (l *inboundLimiter) enter(p peer.ID, s network.Stream, evicted func()) (*stepSlot, bool) {
	now := time.Now()
	l.mu.Lock()
	if l.active[p] >= l.perPeer {
		l.mu.Unlock()
		return nil, false
	}
	var victim *stepSlot
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
	sl := &stepSlot{p: p, s: s, idle: true, since: now}
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
// inboundLimiter), or nil. l.mu is held.
func (l *inboundLimiter) victimLocked(p peer.ID) *stepSlot {
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
	var best *stepSlot
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
func (l *inboundLimiter) busy(sl *stepSlot, busy bool) {
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

// leave releases sl's slot, unless it was evicted (its slot went to the
// stream that evicted it).
func (l *inboundLimiter) leave(sl *stepSlot) {
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
	l.releaseLocked(p)
}

func (l *inboundLimiter) releaseLocked(p peer.ID) {
	if l.active[p]--; l.active[p] <= 0 {
		delete(l.active, p)
	}
	l.sum--
}
