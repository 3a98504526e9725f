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
	n := New(lat)
	t.Cleanup(func() { _ = n.Close() })
	a, err := n.NewHost(4, 8)
	if err != nil {
		t.Fatal(err)
	}
	b, err := n.NewHost(4, 8)
	if err != nil {
		t.Fatal(err)
	}
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
