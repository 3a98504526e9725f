package memnet

import (
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/pspnode/pspnode/internal/vclock"
)

// A host forgets what identify told it of a peer forgetAfter after its
// last connection to the peer closed (once another connection closes),
// keeps the peer's addresses so it can dial it again, and forgets nothing
// of a peer it has connected to again.
func TestForgetsPeersLetGo(t *testing.T) {
	for _, tc := range []struct {
		name      string
		after     time.Duration
		reconnect bool
		forgotten bool
	}{
		{"just after", forgetAfter / 2, false, false},
		{"after forgetAfter", forgetAfter + time.Second, false, true},
		{"connected again", forgetAfter + time.Second, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vclock.Test(t, func(t *testing.T) {
				n := New(0)
				defer n.Close()
				a, err := n.NewHost(8, 16)
				if err != nil {
					t.Fatal(err)
				}
				b, err := n.NewHost(8, 16)
				if err != nil {
					t.Fatal(err)
				}
				c, err := n.NewHost(8, 16)
				if err != nil {
					t.Fatal(err)
				}
				known := func() bool { ps, _ := a.Peerstore().GetProtocols(b.ID()); return len(ps) > 0 }
				connect := func(p peer.ID) {
					t.Helper()
					if err := a.Connect(t.Context(), peer.AddrInfo{ID: p}); err != nil {
						t.Fatal(err)
					}
				}
				connect(b.ID())
				for !known() { // identify runs in the background
					time.Sleep(10 * time.Millisecond)
				}
				_ = a.Network().ClosePeer(b.ID())
				time.Sleep(tc.after)
				if tc.reconnect {
					connect(b.ID())
				}
				// Another connection closes: a forgets what is due.
				connect(c.ID())
				_ = a.Network().ClosePeer(c.ID())
				if forgotten := !known(); forgotten != tc.forgotten {
					t.Errorf("b's protocols forgotten %v, want %v", forgotten, tc.forgotten)
				}
				if len(a.Peerstore().Addrs(b.ID())) == 0 {
					t.Error("b's addresses were forgotten too")
				}
			})
		})
	}
}
