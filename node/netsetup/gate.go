package netsetup

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/control"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/pnet"
	"github.com/libp2p/go-libp2p/core/transport"
	libp2pquic "github.com/libp2p/go-libp2p/p2p/transport/quic"
	"github.com/libp2p/go-libp2p/p2p/transport/tcp"
	"github.com/libp2p/go-libp2p/p2p/transport/tcpreuse"
	libp2pwebrtc "github.com/libp2p/go-libp2p/p2p/transport/webrtc"
	ws "github.com/libp2p/go-libp2p/p2p/transport/websocket"
	libp2pwebtransport "github.com/libp2p/go-libp2p/p2p/transport/webtransport"
	ma "github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"
	"github.com/prometheus/client_golang/prometheus"
)

// Refused connections. A connection whose security handshake fails (the
// peer holds another swarm key, or none, or is no libp2p peer at all) and
// a connection from a peer outside the allowlist are refused, counted in
// psp_handshakes_refused_total{reason} and logged, on both sides.
//
// go-libp2p reports a failed inbound upgrade to nobody, so the node's TCP
// transport hands its upgrader connections it watches (watchedConn): the
// gater marks a connection once its security handshake is done, and a
// connection closed before that was refused; outbound, an upgrade that
// fails before it. A dial abandoned mid-handshake (it timed out, or another
// address of the same peer answered first) is counted too: neither side can
// tell it from a wrong key, which often shows as a handshake that hangs
// until the dialler gives up.

// Refused connections are logged at most RefusedLogBurst times per
// RefusedLogEvery; the others in that interval are counted and said in one
// summary line, with their count, at the first refusal after it ends (the
// metric counts every one at once). Anyone can open TCP connections to a
// private job's node that fail its handshake: 108 000 junk connections in
// 10 s wrote 73 377 warning lines (14 MB) when each wrote one.
const (
	RefusedLogEvery = 10 * time.Second
	RefusedLogBurst = 5
)

// Reasons a connection is refused (the reason label).
const (
	refusedHandshake  = "handshake"   // security handshake failed: another swarm key, or none
	refusedNotAllowed = "not_allowed" // peer not in the allowlist
)

// gate is the node's connection gater and handshake counter.
type gate struct {
	allow   map[peer.ID]bool // nil: every peer
	private bool             // a swarm key or an allowlist is set
	// natted refuses inbound connections not through a relay (a test
	// hook: faults.Host.RefuseDirectInbound).
	natted  bool
	log     *slog.Logger
	refused *prometheus.CounterVec

	// The warnings' rate limit: the current interval's start, the
	// warnings logged in it, and the refusals not logged, by reason.
	logMu      sync.Mutex
	logStart   time.Time
	logged     int
	suppressed map[string]int
}

func newGate(allow []peer.ID, log *slog.Logger, reg prometheus.Registerer) *gate {
	g := &gate{
		log: log,
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "psp", Name: "handshakes_refused_total",
			Help: "Connections refused: reason=handshake, the security handshake failed (another swarm key, or none, or not a libp2p peer); reason=not_allowed, the peer is not in the allowlist.",
		}, []string{"reason"}),
	}
	reg.MustRegister(g.refused)
	for _, r := range []string{refusedHandshake, refusedNotAllowed} {
		g.refused.WithLabelValues(r) // export zeros, so a scrape shows the series
	}
	if len(allow) > 0 {
		g.allow = make(map[peer.ID]bool, len(allow))
		for _, p := range allow {
			g.allow[p] = true
		}
	}
	return g
}

// GateOptions are the libp2p options for a host the node builds: the
// connection gater, which refuses peers outside allow (nil: every peer)
// and counts refused connections in reg, the watched TCP transport, and
// either the private network of psk (TCP only: QUIC, WebTransport and
// WebRTC cannot carry a pre-shared key) or, with no psk, go-libp2p's other
// default transports. refuseDirectInbound is a test hook
// (faults.Host.RefuseDirectInbound): the host accepts only relayed
// connections, as behind a NAT.
func GateOptions(psk pnet.PSK, allow []peer.ID, refuseDirectInbound bool, log *slog.Logger, reg prometheus.Registerer) []libp2p.Option {
	g := newGate(allow, log, reg)
	g.private = len(psk) > 0 || len(allow) > 0
	g.natted = refuseDirectInbound
	opts := []libp2p.Option{
		libp2p.ConnectionGater(g),
		libp2p.Transport(func(u transport.Upgrader, rm network.ResourceManager, shared *tcpreuse.ConnMgr) (*tcp.TcpTransport, error) {
			return tcp.NewTCPTransport(&watchingUpgrader{Upgrader: u, g: g}, rm, shared)
		}),
	}
	if len(psk) > 0 {
		return append(opts, libp2p.PrivateNetwork(psk))
	}
	return append(opts,
		libp2p.Transport(libp2pquic.NewTransport),
		libp2p.Transport(ws.New),
		libp2p.Transport(libp2pwebtransport.New),
		libp2p.Transport(libp2pwebrtc.New),
	)
}

func (g *gate) allowed(p peer.ID) bool { return g.allow == nil || g.allow[p] }

func (g *gate) refuse(reason string, dir network.Direction, p peer.ID, addr ma.Multiaddr, err error) {
	g.refused.WithLabelValues(reason).Inc()
	args := []any{"reason", reason, "direction", dir.String(), "remote", addr}
	if p != "" {
		args = append(args, "peer", p)
	}
	if err != nil {
		args = append(args, "err", err)
	}
	if reason != refusedNotAllowed && !g.private {
		// An open job: port scans and abandoned dials fail handshakes too,
		// and say nothing about keys. Counted; logged only for debugging.
		g.log.Debug("a connection's security handshake failed", args...)
		return
	}
	if !g.mayWarn(reason, time.Now()) {
		return
	}
	if reason == refusedNotAllowed {
		g.log.Warn("refused a connection: peer not in the allowlist", args...)
	} else {
		g.log.Warn("refused a connection: security handshake failed (another swarm key, or none?)", args...)
	}
}

// mayWarn reports whether a refusal for reason at now may be logged on its
// own (see RefusedLogEvery); if not, it is counted for the summary. The
// first refusal after an interval in which some were not logged logs
// their summary.
func (g *gate) mayWarn(reason string, now time.Time) bool {
	g.logMu.Lock()
	var summary map[string]int
	var since time.Duration
	if now.Sub(g.logStart) >= RefusedLogEvery {
		if len(g.suppressed) > 0 {
			summary, since = g.suppressed, now.Sub(g.logStart)
		}
		g.logStart, g.logged, g.suppressed = now, 0, nil
	}
	ok := g.logged < RefusedLogBurst
	if ok {
		g.logged++
	} else {
		if g.suppressed == nil {
			g.suppressed = make(map[string]int)
		}
		g.suppressed[reason]++
	}
	g.logMu.Unlock()
	if summary != nil {
		total := 0
		args := []any{}
		for _, r := range []string{refusedHandshake, refusedNotAllowed} {
			if k := summary[r]; k > 0 {
				total += k
				args = append(args, r, k)
			}
		}
		g.log.Warn(fmt.Sprintf("refused %d more connections in the last %s, not logged one by one (psp_handshakes_refused_total counts every one)",
			total, since.Round(time.Second)), args...)
	}
	return ok
}

// InterceptPeerDial refuses to dial peers outside the allowlist.
func (g *gate) InterceptPeerDial(p peer.ID) bool { return g.allowed(p) }

func (g *gate) InterceptAddrDial(peer.ID, ma.Multiaddr) bool { return true }

// InterceptAccept accepts every connection, but for a node that plays one
// behind a NAT (faults.Host) only relayed ones.
func (g *gate) InterceptAccept(cm network.ConnMultiaddrs) bool {
	return !g.natted || isCircuit(cm.RemoteMultiaddr())
}

// InterceptSecured refuses a peer outside the allowlist, and marks a
// watched connection as past its handshake.
func (g *gate) InterceptSecured(dir network.Direction, p peer.ID, cm network.ConnMultiaddrs) bool {
	wc, _ := cm.(*watchedConn)
	if wc != nil {
		wc.settle()
	}
	if !g.allowed(p) {
		g.refuse(refusedNotAllowed, dir, p, cm.RemoteMultiaddr(), nil)
		return false
	}
	return true
}

func (g *gate) InterceptUpgraded(network.Conn) (bool, control.DisconnectReason) { return true, 0 }

// watchingUpgrader is the TCP transport's upgrader: it watches every
// connection through its handshake.
type watchingUpgrader struct {
	transport.Upgrader
	g *gate
}

// UpgradeGatedMaListener watches the connections the listener accepts.
func (u *watchingUpgrader) UpgradeGatedMaListener(t transport.Transport, l transport.GatedMaListener) transport.Listener {
	return u.Upgrader.UpgradeGatedMaListener(t, &watchingListener{GatedMaListener: l, g: u.g})
}

// Upgrade (outbound connections) counts an upgrade that failed before the
// security handshake was done.
func (u *watchingUpgrader) Upgrade(ctx context.Context, t transport.Transport, c manet.Conn, dir network.Direction, p peer.ID, scope network.ConnManagementScope) (transport.CapableConn, error) {
	wc := &watchedConn{Conn: c}
	cc, err := u.Upgrader.Upgrade(ctx, t, wc, dir, p, scope)
	if err != nil && wc.refused() {
		u.g.refuse(refusedHandshake, dir, p, c.RemoteMultiaddr(), err)
	}
	return cc, err
}

type watchingListener struct {
	transport.GatedMaListener
	g *gate
}

func (l *watchingListener) Accept() (manet.Conn, network.ConnManagementScope, error) {
	c, scope, err := l.GatedMaListener.Accept()
	if err != nil {
		return c, scope, err
	}
	return &watchedConn{Conn: c, onEarlyClose: func() {
		l.g.refuse(refusedHandshake, network.DirInbound, "", c.RemoteMultiaddr(), nil)
	}}, scope, nil
}

// watchedConn is a connection in or past its security handshake.
type watchedConn struct {
	manet.Conn
	// done is set once the handshake is over: secured (the gater saw it),
	// or refused and counted.
	done atomic.Bool
	// onEarlyClose, if set, runs when the connection closes before its
	// handshake was done (inbound connections).
	onEarlyClose func()
}

// settle marks the handshake as secured.
func (c *watchedConn) settle() { c.done.Store(true) }

// refused marks a connection that failed before its handshake was done:
// true for the first caller only, who counts it.
func (c *watchedConn) refused() bool { return c.done.CompareAndSwap(false, true) }

func (c *watchedConn) Close() error {
	if c.onEarlyClose != nil && c.refused() {
		c.onEarlyClose()
	}
	return c.Conn.Close()
}

// IsTCPAddr reports whether a listen multiaddr is plain TCP (no WebSocket
// or other protocol on top): the only kind a private network runs on.
func IsTCPAddr(s string) bool {
	a, err := ma.NewMultiaddr(s)
	if err != nil || len(a) == 0 {
		return false
	}
	return a[len(a)-1].Protocol().Code == ma.P_TCP
}

// negotiationFailed is how go-libp2p reports a connection whose first
// bytes were not the multistream-select negotiation of a security
// protocol: what a node without a swarm key reads from one with a key
// (its bytes are encrypted), and what two nodes with different keys read
// from each other.
const negotiationFailed = "failed to negotiate security protocol"

// HandshakeHint says what a join failure's text suggests about swarm keys
// ("" for nothing), for a node with a key (private) or without.
func HandshakeHint(err string, private bool) string {
	switch {
	case strings.Contains(err, negotiationFailed) && !private:
		return " (the connection was made but the security handshake failed: a private job's nodes answer so to a node without its swarm key; is --swarm-key missing?)"
	case strings.Contains(err, negotiationFailed):
		return " (the connection was made but the security handshake failed: does the bootstrap peer hold the same swarm key (--swarm-key)? a node with another key, or none, fails so)"
	case private && strings.Contains(err, "deadline exceeded"):
		return " (with a swarm key, a handshake with a node that has none hangs until the dial gives up: does the bootstrap peer run with the same --swarm-key?)"
	}
	return ""
}
