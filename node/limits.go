package node

import (
	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/network"
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
	limits.AddProtocolPeerLimit(wire.ExchangeProtocol(cfg.Job), perPeer, rcmgr.BaseLimitIncrease{})
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
