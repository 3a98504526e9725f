package memnet

import (
	"context"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
)

// A closed host can no longer be reached by any path: not through the
// wrapper's Connect, and not by a raw dial on the underlying network (the
// path libp2p's own services take). Mocknet alone would accept the raw dial
// over an existing link and hand back a connection to a dead host.
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
