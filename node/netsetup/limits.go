package netsetup

import (
	"cmp"
	"slices"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/protocol"
	rcmgr "github.com/libp2p/go-libp2p/p2p/host/resource-manager"
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
// So a node raises the inbound limits to minInboundConns (or what the
// machine's file descriptors allow: half of the manager's share of them),
// the transient scope's to half that, and keeps its watermarks at most a
// quarter of the inbound limit: the connection manager trims idle peers
// long before the limit is near. And the inbound guard (TrimInbound)
// closes idle, unprotected inbound connections once inbound connections
// pass three quarters of the limit, so that the last quarter stays free
// for new peers and the peers the node needs.
const minInboundConns = 1024

// ConnLimits are the connection limits of a host a node builds.
type ConnLimits struct {
	Inbound   int // the resource manager's inbound connection limit
	Low, High int // the connection manager's watermarks
}

// ResourceManager is go-libp2p's default resource manager (limits scaled
// to the machine's memory and file descriptors) with the inbound
// connection limits above, plus per-peer stream caps on the protocols
// capped (a node's step, model and exchange protocols), so that one peer
// cannot hold more than perPeer streams of either open at the transport
// level. It returns the limits the node's connection manager (watermarks
// low and high asked) and inbound guard must keep to.
func ResourceManager(capped []protocol.ID, perPeer, low, high int) (network.ResourceManager, ConnLimits, error) {
	limits := rcmgr.DefaultLimits
	libp2p.SetDefaultServiceLimits(&limits)
	k := perPeer
	base := rcmgr.BaseLimit{Streams: 2 * k, StreamsInbound: k, StreamsOutbound: k, Memory: 16 << 20}
	for _, p := range capped {
		limits.AddProtocolPeerLimit(p, base, rcmgr.BaseLimitIncrease{})
	}
	concrete, cl := raiseConnLimits(limits.AutoScale(), low, high)
	rm, err := rcmgr.NewResourceManager(rcmgr.NewFixedLimiter(concrete))
	return rm, cl, err
}

// raiseConnLimits raises auto's inbound connection limits as the comment
// above says, and returns them with the watermarks low and high clamped to
// a quarter of the inbound limit.
func raiseConnLimits(auto rcmgr.ConcreteLimitConfig, low, high int) (rcmgr.ConcreteLimitConfig, ConnLimits) {
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
	cl := ConnLimits{Inbound: inbound, Low: low, High: high}
	if q := inbound / 4; cl.High > q {
		cl.High = q
	}
	cl.Low = min(cl.Low, cl.High)
	return p.Build(auto), cl
}

// Connection bound. Every connection costs a file descriptor, buffers and
// keep-alives, so a node holds at most a node Config's Limits.ConnHigh of them whatever
// the population. libp2p's basic connection manager does not bound them:
// it trims only the connections that are neither protected nor younger
// than its grace period, and only down to ConnLow of those, so the
// protected ones (the sampler pool both ways, the estimator's zone, the
// gossip mesh) and every connection opened within the grace period come
// on top. A node sampling its step queries from 200 peers held about 155
// connections with watermarks 32/96.
//
// So the node can trim its host itself (Config.Limits.BoundConns; any host, its
// own or one given with WithHost): every TrimEvery, once it holds more than ConnHigh
// connections, it closes unprotected ones until it holds ConnLow, those
// with the fewest open streams first (idle ones before ones that may
// carry a query), then the oldest, none younger than ConnMinAge (a
// connection just dialled for a query or a lookup gets to carry it).
// What the barrier needs is protected by the overlay and the gossip
// layer: the pool, whose connections show departures at once, the
// peers whose pools hold this node, the zone the estimator counts, and
// the mesh. A sampled peer with no connection costs a dial, counted in
// psp_step_dials_total (Status.StepDials).
const (
	// TrimEvery is how often a node trims.
	TrimEvery = time.Second
	// ConnMinAge is the least age of a connection trimmed.
	ConnMinAge = 2 * time.Second
)

// TrimConns closes unprotected connections of h down to low if it holds
// more than high, and returns how many it closed.
func TrimConns(h host.Host, now time.Time, low, high int) int {
	conns := h.Network().Conns()
	if len(conns) <= high {
		return 0
	}
	cm := h.ConnManager()
	type cand struct {
		c       network.Conn
		streams int
		opened  time.Time
	}
	var cands []cand
	for _, c := range conns {
		opened := c.Stat().Opened
		if now.Sub(opened) < ConnMinAge || cm.IsProtected(c.RemotePeer(), "") {
			continue
		}
		cands = append(cands, cand{c, len(c.GetStreams()), opened})
	}
	slices.SortFunc(cands, func(a, b cand) int {
		return cmp.Or(cmp.Compare(a.streams, b.streams), a.opened.Compare(b.opened))
	})
	k := min(len(conns)-low, len(cands))
	for _, c := range cands[:k] {
		_ = c.c.CloseWithError(network.ConnGarbageCollected)
	}
	return k
}

// The inbound guard keeps the last quarter of a built host's inbound
// connection limit free (ResourceManager): when a connection comes in and the
// host holds more than three quarters of the limit inbound, it closes
// inbound connections that carry no stream, are older than ConnMinAge and
// that the connection manager does not protect (the overlay protects the
// peers it needs: its sampler pool, the peers whose pools hold this node,
// its zone), oldest first, down to half the limit; at most once per
// GuardPause. Idle peers that hold connections only to fill the limit
// are closed as they pile up, long before it refuses a new peer.
const GuardPause = 100 * time.Millisecond

// TrimInbound closes idle unprotected inbound connections of h down to
// half the inbound limit if h holds more than three quarters of it, and
// returns how many it closed.
func TrimInbound(h host.Host, now time.Time, limit int) int {
	var in []network.Conn
	for _, c := range h.Network().Conns() {
		if c.Stat().Direction == network.DirInbound {
			in = append(in, c)
		}
	}
	if 4*len(in) <= 3*limit {
		return 0
	}
	cm := h.ConnManager()
	var cands []network.Conn
	for _, c := range in {
		if len(c.GetStreams()) == 0 && now.Sub(c.Stat().Opened) >= ConnMinAge && !cm.IsProtected(c.RemotePeer(), "") {
			cands = append(cands, c)
		}
	}
	slices.SortFunc(cands, func(a, b network.Conn) int { return a.Stat().Opened.Compare(b.Stat().Opened) })
	k := min(len(in)-limit/2, len(cands))
	for _, c := range cands[:k] {
		_ = c.CloseWithError(network.ConnGarbageCollected)
	}
	return k
}
