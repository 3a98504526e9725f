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

// A closed host is forgotten: once it has closed, nothing of the network
// refers to it, nor to what its stream handlers (also ones it removed
// before: go-multistream leaves copies of them in its slice's spare
// capacity) and notifiees close over (in a testnet, the whole node), nor
// to its peerstore; even though a peer still holds a stream and a
// connection it had to it. (go-libp2p's mocknet keeps every host it made.)
func TestClosedHostReleased(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := New(5 * time.Millisecond)
		defer n.Close()
		a, err := n.NewHost(4, 8)
		if err != nil {
			t.Fatal(err)
		}
		var byHost, byHandler, byNotifiee, byRemoved, byStore weak.Pointer[payload]
		var host weak.Pointer[Host]
		var held network.Stream // a's end of a stream to b, never closed
		func() {
			b, err := n.NewHost(4, 8)
			if err != nil {
				t.Fatal(err)
			}
			host = weak.Make(b)
			ph, pn, pr, pb, psp := new(payload), new(payload), new(payload), new(payload), new(payload)
			byHandler, byNotifiee, byRemoved, byHost, byStore = weak.Make(ph), weak.Make(pn), weak.Make(pr), weak.Make(pb), weak.Make(psp)
			// Handlers removed while the host runs, as a node removes its
			// own when it shuts down.
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
			b.SetStreamHandler("/release/2", func(s network.Stream) {
				_, _ = io.ReadAll(s) // until the host closes
				_ = s.Reset()
			})
			b.Network().Notify(&network.NotifyBundle{ConnectedF: func(network.Network, network.Conn) {
				runtime.KeepAlive(pn)
			}})
			b.Peerstore().Put(b.ID(), "payload", psp)
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
			if held, err = a.NewStream(context.Background(), b.ID(), "/release/2"); err != nil {
				t.Fatal(err)
			}
			if _, err := held.Write([]byte("hello")); err != nil {
				t.Fatal(err)
			}
			if len(b.Peerstore().Peers()) < 2 {
				t.Fatal("b's peerstore knows no other peer before the close; the test checks nothing")
			}
			b.Peerstore().Put(b.ID(), "host", pb)
			if err := b.Close(); err != nil {
				t.Fatal(err)
			}
		}()
		synctest.Wait() // every goroutine of the exchange and the close has finished or blocked
		alive := func() bool {
			return host.Value() != nil || byHost.Value() != nil || byHandler.Value() != nil ||
				byNotifiee.Value() != nil || byRemoved.Value() != nil || byStore.Value() != nil
		}
		for i := 0; i < 10 && alive(); i++ {
			runtime.GC()
		}
		for name, p := range map[string]weak.Pointer[payload]{
			"its stream handler": byHandler, "a stream handler it removed": byRemoved,
			"its notifiee": byNotifiee, "its peerstore": byStore, "the host": byHost,
		} {
			if p.Value() != nil {
				t.Errorf("an object only %s refers to is still alive after the host closed", name)
			}
		}
		if host.Value() != nil {
			t.Error("the closed host is still alive")
		}
		if _, err := held.Write([]byte("x")); err == nil {
			t.Error("a write on a stream to the closed host succeeded")
		}
		runtime.KeepAlive(held)
	})
}
