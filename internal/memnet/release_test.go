package memnet

import (
	"context"
	"io"
	"runtime"
	"testing"
	"testing/synctest"
	"time"
	"weak"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/protocol"
)

// payload stands for a node: something only a host's stream handler or
// notifiee refers to.
type payload struct{ buf [1 << 16]byte }

// A closed host lets go of what its services hung on it: mocknet keeps the
// host itself for as long as the network lives, but the objects its stream
// handlers and notifiees close over (in a testnet, the whole node), also
// handlers it removed before, must be collectable once it has closed, and
// so must its peerstore.
func TestClosedHostReleased(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := New(5 * time.Millisecond) // shaped: the handler is wrapped too
		defer n.Close()
		a, err := n.NewHost(4, 8)
		if err != nil {
			t.Fatal(err)
		}
		b, err := n.NewHost(4, 8)
		if err != nil {
			t.Fatal(err)
		}
		var byHandler, byNotifiee, byRemoved weak.Pointer[payload]
		func() {
			ph, pn, pr := new(payload), new(payload), new(payload)
			byHandler, byNotifiee, byRemoved = weak.Make(ph), weak.Make(pn), weak.Make(pr)
			// Handlers removed while the host runs, as a node removes its
			// own when it shuts down: go-multistream leaves copies of them
			// in its slice's spare capacity.
			for _, pid := range []protocol.ID{"/removed/1", "/removed/2"} {
				b.SetStreamHandler(pid, func(s network.Stream) { _ = s.Reset(); runtime.KeepAlive(pr) })
			}
			b.RemoveStreamHandler("/removed/1")
			b.RemoveStreamHandler("/removed/2")
			served := make(chan struct{})
			b.SetStreamHandler("/release/1", func(s network.Stream) {
				_, _ = io.ReadAll(s)
				_ = s.Close()
				runtime.KeepAlive(ph)
				close(served)
			})
			b.Network().Notify(&network.NotifyBundle{ConnectedF: func(network.Network, network.Conn) {
				runtime.KeepAlive(pn)
			}})
			s, err := a.NewStream(context.Background(), b.ID(), "/release/1")
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.Write([]byte("hello")); err != nil {
				t.Fatal(err)
			}
			_ = s.CloseWrite()
			<-served
			_ = s.Close()
		}()
		if len(b.Peerstore().Peers()) == 0 {
			t.Fatal("b's peerstore is empty before the close; the test checks nothing")
		}
		store := weak.Make(b.ps.get())
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
		synctest.Wait() // every goroutine of the exchange and the close has finished or blocked
		for i := 0; i < 10 && (byHandler.Value() != nil || byNotifiee.Value() != nil || byRemoved.Value() != nil || store.Value() != nil); i++ {
			runtime.GC()
		}
		if byHandler.Value() != nil {
			t.Error("an object only a closed host's stream handler refers to is still alive")
		}
		if byRemoved.Value() != nil {
			t.Error("an object only a removed stream handler of a closed host refers to is still alive")
		}
		if byNotifiee.Value() != nil {
			t.Error("an object only a closed host's notifiee refers to is still alive")
		}
		if store.Value() != nil {
			t.Error("a closed host's peerstore is still alive")
		}
		if ps := b.Peerstore().Peers(); len(ps) != 0 {
			t.Errorf("closed host's peerstore still knows %d peers", len(ps))
		}
	})
}
