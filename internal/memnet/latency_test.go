package memnet

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
)

// Links add the configured one-way latency: an echo takes two of them.
func TestLatency(t *testing.T) {
	const lat = 40 * time.Millisecond
	a, b := twoHosts(t, lat)
	b.SetStreamHandler("/echo", func(s network.Stream) {
		buf := make([]byte, 1)
		if _, err := io.ReadFull(s, buf); err == nil {
			_, _ = s.Write(buf)
		}
		_ = s.Close()
	})
	ctx := context.Background()
	if err := a.Connect(ctx, peer.AddrInfo{ID: b.ID(), Addrs: b.Addrs()}); err != nil {
		t.Fatal(err)
	}
	s, err := a.NewStream(ctx, b.ID(), "/echo")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := s.Write([]byte{7}); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1)
	if _, err := io.ReadFull(s, buf); err != nil {
		t.Fatal(err)
	}
	if rtt := time.Since(start); rtt < 2*lat {
		t.Errorf("echo took %v, want at least 2 × %v", rtt, lat)
	}
}

// twoHosts returns two hosts on a new network with the given link latency;
// the network closes when the test ends.
func twoHosts(t *testing.T, latency time.Duration) (a, b *Host) {
	t.Helper()
	n := New(latency)
	t.Cleanup(func() { _ = n.Close() })
	a, err := n.NewHost(4, 8)
	if err != nil {
		t.Fatal(err)
	}
	b, err = n.NewHost(4, 8)
	if err != nil {
		t.Fatal(err)
	}
	return a, b
}
