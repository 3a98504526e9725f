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

// A finished stream is let go at once, even though its reader waited
// under a deadline that is still ahead. A node's answerer waits for the
// next request on each idle step stream under a 10-s deadline; a pending
// alarm that held its stream until then kept about three finished
// streams alive for every open one in a 1000-node testnet.
func TestFinishedStreamReleasedBeforeItsDeadline(t *testing.T) {
	for _, latency := range []time.Duration{0, 5 * time.Millisecond} {
		t.Run(latency.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				a, b := twoHosts(t, latency)
				served := make(chan struct{})
				b.SetStreamHandler("/idle/1", func(s network.Stream) {
					_ = s.SetReadDeadline(time.Now().Add(time.Hour))
					_, _ = io.ReadAll(s) // the request, then a wait under the deadline
					_ = s.Close()
					close(served)
				})
				var in, out weak.Pointer[half]
				func() {
					s, err := a.NewStream(context.Background(), b.ID(), "/idle/1")
					if err != nil {
						t.Fatal(err)
					}
					if _, err := s.Write([]byte("request")); err != nil {
						t.Fatal(err)
					}
					synctest.Wait() // b's handler waits for more, under its deadline
					ms := streamOf(t, s.Conn().(*conn), "/idle/1")
					in, out = weak.Make(ms.out), weak.Make(ms.in)
					if n := pendingAlarms(&b.net.alarms); n == 0 {
						t.Fatal("no alarm pending while the answer waits under a deadline; the test checks nothing")
					}
					_ = s.Close()
					<-served
				}()
				synctest.Wait()
				for i := 0; i < 10 && (in.Value() != nil || out.Value() != nil); i++ {
					runtime.GC()
				}
				if in.Value() != nil || out.Value() != nil {
					t.Errorf("a finished stream is still alive an hour before its reader's deadline (request direction %v, reply direction %v)",
						in.Value() != nil, out.Value() != nil)
				}
			})
		})
	}
}

func pendingAlarms(a *alarms) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.queue)
}

// streamOf returns the stream of protocol p open on c.
func streamOf(t *testing.T, c *conn, p protocol.ID) *stream {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	for s := range c.streams {
		if s.Protocol() == p {
			return s
		}
	}
	t.Fatalf("no stream of %s among the %d on the conn", p, len(c.streams))
	return nil
}
