package node

import (
	"bufio"
	"context"
	"net"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/p2p/transport/tcp"
	manet "github.com/multiformats/go-multiaddr/net"

	"github.com/pspnode/pspnode/internal/wire"
	"github.com/pspnode/pspnode/node/netsetup"
)

// A fresh peer can connect to a node, and have its step query answered,
// while 300 idle peers hold a connection each to it, and while 100
// half-open TCP sockets (connected, never a byte of handshake) do. On
// loopback go-libp2p's per-address limits do not apply, so only the
// node's own limits stand. Before, its resource manager's inbound limit
// (252 on a machine of 24 GiB) was below its connection manager's high
// watermark (256): the idle peers were never trimmed and every new peer
// was refused; its transient scope held 79 connections still in their
// handshake, each for 15 s, and 85 half-open sockets refused every peer.
func TestFreshPeerConnectsUnderConnHogs(t *testing.T) {
	t.Run("300 idle peers", testFreshPeerBesideIdlePeers)
	t.Run("100 half-open sockets", testFreshPeerBesideHalfOpen)
}

// tcpTarget is a node on TCP loopback, alone, and its address.
func tcpTarget(t *testing.T) (*Node, peer.AddrInfo) {
	target := buildTestNodesWith(t, 1, "asp", 0, nil, func(s *nodeSetup) { s.WaitPeers = 0 })[0]
	return target, peer.AddrInfo{ID: target.ID(), Addrs: target.Host().Addrs()}
}

func testFreshPeerBesideIdlePeers(t *testing.T) {
	target, ai := tcpTarget(t)
	var hogs []host.Host
	for range 300 {
		h := bareHost(t)
		hogs = append(hogs, h)
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		_ = h.Connect(ctx, ai) // refused ones are the attack working
		cancel()
	}
	held := 0
	for _, h := range hogs {
		if h.Network().Connectedness(target.ID()) == network.Connected {
			held++
		}
	}
	t.Logf("%d of 300 idle peers connected", held)
	if held < 200 {
		t.Fatalf("only %d idle peers connected: not the attack", held)
	}
	freshQuery(t, target, ai, "beside 300 idle peers")
}

func testFreshPeerBesideHalfOpen(t *testing.T) {
	target, ai := tcpTarget(t)
	addr, err := manet.ToNetAddr(target.Host().Addrs()[0])
	if err != nil {
		t.Fatal(err)
	}
	var socks []net.Conn
	for range 100 {
		c, err := net.DialTimeout("tcp", addr.String(), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		socks = append(socks, c)
	}
	t.Cleanup(func() {
		for _, c := range socks {
			_ = c.Close()
		}
	})
	freshQuery(t, target, ai, "beside 100 half-open sockets")
}

// bareHost is a libp2p host that only dials TCP.
func bareHost(t *testing.T) host.Host {
	t.Helper()
	h, err := libp2p.New(libp2p.NoListenAddrs, libp2p.Transport(tcp.NewTCPTransport),
		libp2p.ResourceManager(&network.NullResourceManager{}), libp2p.DisableRelay(), libp2p.DisableMetrics())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })
	return h
}

// freshQuery connects a new peer to target and asks its step, failing t if
// either fails.
func freshQuery(t *testing.T, target *Node, ai peer.AddrInfo, while string) {
	t.Helper()
	fresh := bareHost(t)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := fresh.Connect(ctx, ai); err != nil {
		t.Fatalf("a fresh peer could not connect %s: %v", while, err)
	}
	s, err := fresh.NewStream(ctx, target.ID(), wire.StepProtocol(target.cfg.Job))
	if err != nil {
		t.Fatalf("a fresh peer could not open a step stream %s: %v", while, err)
	}
	defer s.Close()
	_ = s.SetDeadline(time.Now().Add(10 * time.Second))
	if err := wire.WriteFrame(s, wire.MarshalStepRequest(wire.StepRequest{Step: 1})); err != nil {
		t.Fatal(err)
	}
	if _, err := wire.ReadFrame(bufio.NewReader(s), wire.MaxStepFrame); err != nil {
		t.Fatalf("a fresh peer's step query went unanswered %s: %v", while, err)
	}
}

// The inbound guard closes idle, unprotected inbound connections once a
// host holds more than three quarters of its inbound limit, oldest first,
// down to half of it; a protected peer's connection and one carrying a
// stream stay.
func TestInboundGuard(t *testing.T) {
	target, ai := tcpTarget(t)
	const limit = 40
	var peers []host.Host
	for range limit {
		h := bareHost(t)
		if err := h.Connect(t.Context(), ai); err != nil {
			t.Fatal(err)
		}
		peers = append(peers, h)
	}
	protected, busy := peers[0].ID(), peers[1]
	target.Host().ConnManager().Protect(protected, "test")
	s, err := busy.NewStream(t.Context(), target.ID(), wire.StepProtocol(target.cfg.Job))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Reset()
	if !waitFor(10*time.Second, func() bool {
		for _, c := range target.Host().Network().ConnsToPeer(busy.ID()) {
			if len(c.GetStreams()) > 0 {
				return true
			}
		}
		return false
	}) {
		t.Fatal("the busy peer's stream never reached the target")
	}
	// The connections' ages, read from their own clocks (the race
	// detector can take seconds to connect 40 peers).
	var first, last time.Time
	for _, c := range target.Host().Network().Conns() {
		o := c.Stat().Opened
		if first.IsZero() || o.Before(first) {
			first = o
		}
		if o.After(last) {
			last = o
		}
	}
	if got := target.guard.trimInbound(first.Add(netsetup.ConnMinAge-time.Millisecond), limit); got != 0 {
		t.Errorf("closed %d connections younger than %v", got, netsetup.ConnMinAge)
	}
	later := last.Add(netsetup.ConnMinAge)
	if got := target.guard.trimInbound(later, 2*limit); got != 0 {
		t.Errorf("closed %d connections at half the limit", got)
	}
	if got := target.guard.trimInbound(later, limit); got != limit/2 {
		t.Errorf("closed %d connections, want %d (down to half the limit)", got, limit/2)
	}
	for _, p := range []peer.ID{protected, busy.ID()} {
		if target.Host().Network().Connectedness(p) != network.Connected {
			t.Errorf("peer %s was closed: protected or carrying a stream", p)
		}
	}
}
