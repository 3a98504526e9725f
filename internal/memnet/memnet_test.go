package memnet

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	manet "github.com/multiformats/go-multiaddr/net"
)

// A closed host can no longer be reached by any path: not through the
// wrapper's Connect, and not by a raw dial on the underlying network (the
// path libp2p's own services take), which must not hand back a connection
// to a dead host.
func TestClosedHostUnreachable(t *testing.T) {
	a, b := twoHosts(t, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := a.Connect(ctx, peer.AddrInfo{ID: b.ID()}); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Second)
	for a.Network().Connectedness(b.ID()) == network.Connected {
		if time.Now().After(deadline) {
			t.Fatal("connection to the closed host still open after 2 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	tests := []struct {
		name string
		dial func() error
	}{
		{"Connect", func() error { return a.Connect(ctx, peer.AddrInfo{ID: b.ID()}) }},
		{"NewStream", func() error {
			s, err := a.NewStream(ctx, b.ID(), "/x")
			if err == nil {
				_ = s.Reset()
			}
			return err
		}},
		{"raw DialPeer", func() error { _, err := a.Network().DialPeer(ctx, b.ID()); return err }},
	}
	for _, tc := range tests {
		if err := tc.dial(); err == nil {
			t.Errorf("%s to a closed host succeeded", tc.name)
		}
	}
	if got := a.Network().Connectedness(b.ID()); got == network.Connected {
		t.Errorf("after the dials, connectedness to the closed host is %v", got)
	}
}

// Every host gets an address of its own, in a /16 of its own, unless it is
// given one: hosts that share an IP listen on ports of their own, and a
// connection's remote address is the dialled host's.
func TestHostAddresses(t *testing.T) {
	n := NewNet(Config{Seed: 1})
	defer n.Close()
	groups := map[string]bool{}
	for range 300 {
		h, err := n.NewHost(4, 8)
		if err != nil {
			t.Fatal(err)
		}
		ip, err := manet.ToIP(h.Addrs()[0])
		if err != nil || ip.To4() == nil || !manet.IsPublicAddr(h.Addrs()[0]) {
			t.Fatalf("address %v: want a public IPv4 address (%v)", h.Addrs()[0], err)
		}
		g := ip.Mask(net.CIDRMask(16, 32)).String()
		if groups[g] {
			t.Fatalf("two hosts in %s/16", g)
		}
		groups[g] = true
	}
	shared := n.NewIP()
	a, err := n.NewHostWith(HostOptions{Low: 4, High: 8, IP: shared})
	if err != nil {
		t.Fatal(err)
	}
	b, err := n.NewHostWith(HostOptions{Low: 4, High: 8, IP: shared})
	if err != nil {
		t.Fatal(err)
	}
	if a.Addrs()[0].Equal(b.Addrs()[0]) {
		t.Errorf("hosts behind one IP share the address %v", a.Addrs()[0])
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := a.Connect(ctx, peer.AddrInfo{ID: b.ID()}); err != nil {
		t.Fatal(err)
	}
	cs := a.Network().ConnsToPeer(b.ID())
	if len(cs) == 0 || !cs[0].RemoteMultiaddr().Equal(b.Addrs()[0]) {
		t.Errorf("connection's remote address %v, want %v", cs, b.Addrs()[0])
	}
}
